//! Every CUDA op against the CPU reference (random shapes, row tails, every weight format and
//! KV dtype). They need a CUDA GPU: without one they are listed as ignored (skipped, by name);
//! `deploy/gpu-check.sh` runs them with `--include-ignored`.
//!
//! Tolerances: elementwise ops, norms, RoPE and the KV bytes must match the CPU to a few ulps
//! (both compute in f32 with the same formulas; `expf` and `rsqrtf` differ by an ulp or two);
//! the weight GEMVs are compared with the exact (f64) product of the dequantized weights, to
//! 1e-5 of the row's Σ|w·x| (the CPU quantizes activations to 8 bits there, so it is compared
//! to the same reference, looser); attention to 1e-5 absolute.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use engine_cpu::CpuOps;
use engine_cuda::device::GpuDevice;
use engine_cuda::ops::{CudaOps, GpuBuf};
use engine_ops::tensor::{GgmlType, MatrixData, MatrixDesc, dequantize_row};
use engine_ops::{AttnShape, KvWrite, Ops, RopeStyle, SeqKv, TreeKeys};
use engine_service::memory::{HostPageBuffer, HostPages, KvDtype, KvLayout, PageId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> CudaOps {
    let dev = GpuDevice::open(0, None).unwrap_or_else(|e| panic!("no usable GPU: {e}"));
    CudaOps::new(Arc::new(dev)).expect("the GPU's page spaces")
}

fn random(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn up(ops: &CudaOps, v: &[f32]) -> GpuBuf {
    let mut b = GpuBuf::default();
    ops.upload(v, &mut b, 0);
    b
}

fn down(ops: &CudaOps, b: &GpuBuf, n: usize) -> Vec<f32> {
    let v = ops.to_host(b, 0..n);
    ops.take_error().expect("no CUDA error");
    v
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol(i), "{what}[{i}]: GPU {g} vs reference {w} (tolerance {})", tol(i));
    }
}

fn ulps(want: &[f32], n: f32) -> impl Fn(usize) -> f32 + '_ {
    move |i| want[i].abs() * n * f32::EPSILON + 1e-30
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn elementwise_ops_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps::new(1));
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let n = 4096 * 3 + 17;
    let (a, b) = (random(&mut rng, n, 8.0), random(&mut rng, n, 8.0));
    for op in ["silu_mul", "add_assign", "sigmoid_mul", "scale"] {
        let (mut ga, gb) = (up(&g, &a), up(&g, &b));
        let mut ca = a.clone();
        match op {
            "silu_mul" => {
                g.silu_mul(&mut ga, &gb, n);
                c.silu_mul(&mut ca, &b, n);
            }
            "add_assign" => {
                g.add_assign(&mut ga, &gb, n);
                c.add_assign(&mut ca, &b, n);
            }
            "sigmoid_mul" => {
                g.sigmoid_mul(&mut ga, &gb, n);
                c.sigmoid_mul(&mut ca, &b, n);
            }
            _ => {
                g.scale(&mut ga, 0.37, n);
                c.scale(&mut ca, 0.37, n);
            }
        }
        assert_close(op, &down(&g, &ga, n), &ca, ulps(&ca, 8.0));
    }
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn row_moves_match_the_cpu_exactly() {
    let (g, c) = (gpu(), CpuOps::new(1));
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (rows, wa, wb) = (7, 300, 45);
    let (a, b) = (random(&mut rng, rows * wa, 1.0), random(&mut rng, rows * wb, 1.0));
    let (ga, gb) = (up(&g, &a), up(&g, &b));
    let (mut go, mut co) = (GpuBuf::default(), vec![0.0; rows * (wa + wb)]);
    g.concat_cols(&ga, wa, &gb, wb, rows, &mut go);
    c.concat_cols(&a, wa, &b, wb, rows, &mut co);
    assert_eq!(down(&g, &go, co.len()), co, "concat_cols");

    let pick = [6, 0, 3, 3];
    let (mut go, mut co) = (GpuBuf::default(), vec![0.0; pick.len() * wa]);
    g.gather_rows(&ga, wa, &pick, &mut go);
    c.gather_rows(&a, wa, &pick, &mut co);
    assert_eq!(down(&g, &go, co.len()), co, "gather_rows");

    let (heads, hd) = (3, 64);
    let x = random(&mut rng, rows * 2 * heads * hd, 1.0);
    let gx = up(&g, &x);
    let (mut g1, mut g2) = (GpuBuf::default(), GpuBuf::default());
    let (mut c1, mut c2) = (vec![0.0; rows * heads * hd], vec![0.0; rows * heads * hd]);
    g.deinterleave_heads(&gx, rows, heads, hd, &mut g1, &mut g2);
    c.deinterleave_heads(&x, rows, heads, hd, &mut c1, &mut c2);
    assert_eq!(down(&g, &g1, c1.len()), c1, "deinterleave_heads (first)");
    assert_eq!(down(&g, &g2, c2.len()), c2, "deinterleave_heads (second)");
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn norms_and_rope_match_the_cpu() {
    let (g, c) = (gpu(), CpuOps::new(1));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for (rows, width) in [(1, 576), (5, 2048), (3, 100)] {
        let (x, w) = (random(&mut rng, rows * width, 3.0), random(&mut rng, width, 1.0));
        let (gx, gw) = (up(&g, &x), g.vector_from(&w));
        let (mut go, mut co) = (GpuBuf::default(), vec![0.0; rows * width]);
        g.rms_norm(&gx, &gw, 1e-6, rows, &mut go);
        c.rms_norm(&x, &w, 1e-6, rows, &mut co);
        assert_close("rms_norm", &down(&g, &go, co.len()), &co, |i| co[i].abs() * 1e-5 + 1e-6);

        let z = random(&mut rng, rows * width, 3.0);
        let (mut gx, gz) = (up(&g, &x), up(&g, &z));
        let mut cx = x.clone();
        g.gated_rms_norm(&mut gx, &gz, &gw, 1e-6, rows);
        c.gated_rms_norm(&mut cx, &z, &w, 1e-6, rows);
        assert_close("gated_rms_norm", &down(&g, &gx, cx.len()), &cx, |i| cx[i].abs() * 1e-5 + 1e-6);
    }
    let positions = [0usize, 1, 17, 4095, 100_000];
    for (style, head_dim) in [(RopeStyle::AdjacentPairs, 64), (RopeStyle::HalfSplit { rotated: 64 }, 256)] {
        let pairs = style.pairs(head_dim);
        let inv: Vec<f64> = (0..pairs).map(|i| 1.0 / 10000f64.powf(2.0 * i as f64 / (2 * pairs) as f64)).collect();
        let width = 3 * head_dim;
        let x = random(&mut rng, positions.len() * width, 2.0);
        let (mut gt, mut ct) = (Default::default(), Vec::new());
        g.rope_table(&positions, &inv, &mut gt);
        c.rope_table(&positions, &inv, &mut ct);
        let (mut gx, mut cx) = (up(&g, &x), x.clone());
        g.rope(style, &mut gx, width, head_dim, &gt);
        c.rope(style, &mut cx, width, head_dim, &ct);
        assert_close("rope", &down(&g, &gx, cx.len()), &cx, |i| cx[i].abs() * 4.0 * f32::EPSILON + 1e-6);
    }
}

/// Random GGUF-format bytes for `rows` x `cols` (valid scales, random quants).
fn random_weights(rng: &mut ChaCha8Rng, dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let f16 = |x: f32| half::f16::from_f32(x).to_bits().to_le_bytes();
    let mut out = Vec::new();
    for _ in 0..rows {
        for _ in 0..cols / 32 {
            match dtype {
                GgmlType::Q8_0 => {
                    out.extend(f16(rng.random_range(0.001..0.02)));
                    out.extend((0..32).map(|_| rng.random::<u8>()));
                }
                GgmlType::Q4_0 => {
                    out.extend(f16(rng.random_range(0.001..0.05)));
                    out.extend((0..16).map(|_| rng.random::<u8>()));
                }
                GgmlType::Q4_1 => {
                    out.extend(f16(rng.random_range(0.001..0.05)));
                    out.extend(f16(rng.random_range(-0.2..0.2)));
                    out.extend((0..16).map(|_| rng.random::<u8>()));
                }
                GgmlType::F16 => (0..32).for_each(|_| out.extend(f16(rng.random_range(-0.5..0.5)))),
                GgmlType::BF16 => (0..32).for_each(|_| {
                    out.extend(half::bf16::from_f32(rng.random_range(-0.5..0.5)).to_bits().to_le_bytes())
                }),
                GgmlType::F32 => (0..32).for_each(|_| out.extend(rng.random_range(-0.5f32..0.5).to_le_bytes())),
                other => panic!("no generator for {other:?}"),
            }
        }
    }
    out
}

/// Random weights in any format: the K-quants through the reference encoder.
fn random_matrix(rng: &mut ChaCha8Rng, dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    match engine_ops::kquant::KQuantType::of(dtype) {
        Some(k) => engine_ops::kquant::quantize_rows(k, &random(rng, rows * cols, 0.5)),
        None => random_weights(rng, dtype, rows, cols),
    }
}

const FORMATS: [GgmlType; 9] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn weight_gemv_matches_the_exact_product_for_every_format_and_row_count() {
    let (g, c) = (gpu(), CpuOps::new(2));
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for dtype in FORMATS {
        let shapes: &[(usize, usize)] = if dtype.is_kquant() {
            &[(101, 256), (576, 512), (35, 1536)]
        } else {
            &[(101, 96), (576, 576), (35, 1536)]
        };
        for &(out_rows, cols) in shapes {
            let bytes = random_matrix(&mut rng, dtype, out_rows, cols);
            let desc = MatrixDesc {
                name: format!("{dtype:?}"),
                file: None,
                rows: out_rows,
                cols,
                data: MatrixData::Ggml { dtype, bytes: bytes.as_slice().into() },
            };
            let (gw, cw) = (g.matrix(&desc).unwrap(), c.matrix(&desc).unwrap());
            let row_bytes = dtype.row_bytes(cols).unwrap();
            let mut w = vec![0.0f32; out_rows * cols];
            for r in 0..out_rows {
                dequantize_row(dtype, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut w[r * cols..(r + 1) * cols]);
            }
            for x_rows in [1, 3, 8, 9, 16] {
                let x = random(&mut rng, x_rows * cols, 1.0);
                let (exact, bound): (Vec<f32>, Vec<f32>) = (0..x_rows * out_rows)
                    .map(|i| {
                        let (r, o) = (i / out_rows, i % out_rows);
                        let (xs, ws) = (&x[r * cols..(r + 1) * cols], &w[o * cols..(o + 1) * cols]);
                        let dot: f64 = xs.iter().zip(ws).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mag: f64 = xs.iter().zip(ws).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                        (dot as f32, mag as f32)
                    })
                    .unzip();
                let gx = up(&g, &x);
                let mut go = GpuBuf::default();
                g.matmul(&gx, x_rows, &mut [(&gw, &mut go)]);
                let what = format!("{dtype:?} {out_rows}x{cols}, {x_rows} rows");
                assert_close(&what, &down(&g, &go, exact.len()), &exact, |i| bound[i] * 1e-5 + 1e-6);
                let mut co = vec![0.0; x_rows * out_rows];
                c.matmul(&x, x_rows, &mut [(&cw, &mut co)]);
                assert_close(&format!("{what} (CPU)"), &co, &exact, |i| bound[i] * 2e-2 + 1e-4);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn embedding_gather_matches_the_cpu() {
    let (g, c) = (gpu(), CpuOps::new(1));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for dtype in FORMATS {
        let (rows, cols) = (300, if dtype.is_kquant() { 512 } else { 576 });
        let bytes = random_matrix(&mut rng, dtype, rows, cols);
        let desc = MatrixDesc {
            name: "embd".into(),
            file: None,
            rows,
            cols,
            data: MatrixData::Ggml { dtype, bytes: bytes.as_slice().into() },
        };
        let (gw, cw) = (g.matrix(&desc).unwrap(), c.matrix(&desc).unwrap());
        let tokens = [0u32, 299, 17, 17, 150];
        let (mut go, mut co) = (GpuBuf::default(), vec![0.0; tokens.len() * cols]);
        g.embed_rows(&gw, &tokens, &mut go).unwrap();
        c.embed_rows(&cw, &tokens, &mut co).unwrap();
        assert_close(&format!("embed {dtype:?}"), &down(&g, &go, co.len()), &co, ulps(&co, 1.0));
        assert!(g.embed_rows(&gw, &[300], &mut go).is_err(), "a token outside the table is an error");
    }
}

/// Pages `0..n` of space 0 in two pools: the CPU's ops' and the GPU's; a reader ops maps the
/// GPU's pool as space 1 to compare bytes.
fn pages(c: &CpuOps, g: &CudaOps, reader: &CpuOps, layout: KvLayout, n: usize) -> Vec<PageId> {
    let cpu = Arc::new(HostPageBuffer::new(layout.page_bytes(), n));
    let gpu = Arc::new(HostPageBuffer::new(layout.page_bytes(), n));
    c.map_pages(0, cpu as Arc<dyn HostPages>).unwrap();
    g.map_pages(0, gpu.clone() as Arc<dyn HostPages>).unwrap();
    reader.map_pages(1, gpu as Arc<dyn HostPages>).unwrap();
    (0..n as u32).map(|i| PageId::new(0, i)).collect()
}

fn all_bytes(ops: &CpuOps, layout: &KvLayout, space: u32, n: usize) -> Vec<u8> {
    (0..n as u32)
        .flat_map(|i| ops.read_page_bytes(layout, PageId::new(space, i), 0, layout.page_bytes()).unwrap())
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn kv_writes_and_attention_match_the_cpu_for_chains_and_trees() {
    let (g, c, reader) = (gpu(), CpuOps::new(2), CpuOps::new(1));
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for dtype in [KvDtype::F16, KvDtype::Fp8] {
        for (n_heads, n_kv_heads, head_dim) in [(9, 3, 64), (8, 2, 128), (4, 1, 256)] {
            let layout = KvLayout { n_layers: 2, n_kv_heads, head_dim, page_tokens: 16, dtype };
            let ids = pages(&c, &g, &reader, layout, 48);
            let kvd = n_kv_heads * head_dim;
            let qd = n_heads * head_dim;
            let shape = AttnShape { layer: 1, n_heads, n_kv_heads, head_dim, scale: 1.0 / (head_dim as f32).sqrt() };
            // A chain prefill of 700 rows from position 0 (three attention splits for its last
            // rows), then a 5-node tree at 700.
            let prefill = 700;
            let (k, v, q) = (
                random(&mut rng, prefill * kvd, 2.0),
                random(&mut rng, prefill * kvd, 2.0),
                random(&mut rng, prefill * qd, 1.0),
            );
            // What the backend does before every pass: the pages come to the device.
            g.check_pages(&ids).unwrap();
            let seq = SeqKv { layout: &layout, pages: &ids, start_pos: 0, rows: 0..prefill, tree: None };
            let write = KvWrite { seq: &seq, layer: 1, k_scale: 0.5, v_scale: 2.0 };
            let (gk, gv, gq) = (up(&g, &k), up(&g, &v), up(&g, &q));
            g.write_kv(&write, &gk, &gv);
            c.write_kv(&write, &k, &v);
            let (mut go, mut co) = (GpuBuf::default(), vec![0.0; prefill * qd]);
            g.grow(&mut go, prefill * qd);
            g.attention(&shape, &seq, &gq, &mut go);
            c.attention(&shape, &seq, &q, &mut co);
            let what = format!("{dtype:?} {n_heads}/{n_kv_heads}x{head_dim}");
            assert_close(&format!("chain attention {what}"), &down(&g, &go, co.len()), &co, |_| 1e-5);
            g.flush_pages(&ids).unwrap();
            assert_eq!(all_bytes(&reader, &layout, 1, 48), all_bytes(&c, &layout, 0, 48), "KV bytes {what}");

            let tree = TreeKeys::new(&[None, Some(0), Some(0), Some(1), Some(3)]).unwrap();
            let n = tree.len();
            let (k, v, q) =
                (random(&mut rng, n * kvd, 2.0), random(&mut rng, n * kvd, 2.0), random(&mut rng, n * qd, 1.0));
            let seq = SeqKv { layout: &layout, pages: &ids, start_pos: prefill, rows: 0..n, tree: Some(&tree) };
            let write = KvWrite { seq: &seq, layer: 1, k_scale: 0.5, v_scale: 2.0 };
            let (gk, gv, gq) = (up(&g, &k), up(&g, &v), up(&g, &q));
            g.write_kv(&write, &gk, &gv);
            c.write_kv(&write, &k, &v);
            let (mut go, mut co) = (GpuBuf::default(), vec![0.0; n * qd]);
            g.grow(&mut go, n * qd);
            g.attention(&shape, &seq, &gq, &mut go);
            c.attention(&shape, &seq, &q, &mut co);
            assert_close(&format!("tree attention {what}"), &down(&g, &go, co.len()), &co, |_| 1e-5);

            // The accepted path 0 -> 1 -> 3 moves into place; a page is copied on write.
            for (depth, node) in [(1, 1), (2, 3)] {
                g.move_kv(&layout, &ids, prefill + node, prefill + depth).unwrap();
                c.move_kv(&layout, &ids, prefill + node, prefill + depth).unwrap();
            }
            g.copy_page(&layout, ids[2], ids[47]).unwrap();
            c.copy_page(&layout, ids[2], ids[47]).unwrap();
            g.flush_pages(&ids).unwrap();
            assert_eq!(all_bytes(&reader, &layout, 1, 48), all_bytes(&c, &layout, 0, 48), "KV after moves {what}");
            g.unmap_pages(0);
            c.unmap_pages(0);
            reader.unmap_pages(1);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn unmapped_pages_are_errors_not_faults() {
    let g = gpu();
    let layout = KvLayout { n_layers: 1, n_kv_heads: 1, head_dim: 64, page_tokens: 16, dtype: KvDtype::F16 };
    assert!(g.check_pages(&[PageId::new(3, 0)]).is_err());
    assert!(g.move_kv(&layout, &[PageId::new(3, 0)], 0, 1).is_err());
    assert!(g.copy_page(&layout, PageId::new(3, 0), PageId::new(3, 1)).is_err());
    let private = g.private_pages(&layout, 2).unwrap();
    g.zero_private_pages(&layout, &private).unwrap();
    g.check_pages(&private).unwrap();
    g.free_private_pages(&private);
    assert!(g.check_pages(&private).is_err());
    g.take_error().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn device_argmax_is_the_hosts_argmax() {
    let g = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let vocab = 49_152 + 7;
    let mut rows: Vec<Vec<f32>> = (0..6).map(|_| random(&mut rng, vocab, 10.0)).collect();
    // Ties (the lowest index wins), NaN (never wins), all -inf, all NaN.
    rows[1][100] = 50.0;
    rows[1][40_000] = 50.0;
    rows[2][5] = f32::NAN;
    rows[2][6] = 60.0;
    rows[3].fill(f32::NEG_INFINITY);
    rows[4].fill(f32::NAN);
    let flat: Vec<f32> = rows.concat();
    let buf = up(&g, &flat);
    let got = g.argmax_rows(&buf, 0, rows.len(), vocab).unwrap();
    let want: Vec<u32> = rows.iter().map(|r| engine_service::sampling::argmax(r)).collect();
    assert_eq!(got, want);
    assert_eq!(g.argmax_rows(&buf, 2, 1, vocab).unwrap(), vec![want[2]]);
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn device_pages_reach_the_host_when_flushed_and_host_pages_reach_the_device() {
    let (g, c, reader) = (gpu(), CpuOps::new(1), CpuOps::new(1));
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let layout = KvLayout { n_layers: 1, n_kv_heads: 2, head_dim: 64, page_tokens: 16, dtype: KvDtype::F16 };
    let ids = pages(&c, &g, &reader, layout, 4);
    // KV the host already holds (an earlier engine's pages in the arena): the CPU writes it
    // into the GPU's host pages, and the GPU's attention must read it.
    let kvd = 2 * 64;
    let (k, v, q) =
        (random(&mut rng, 40 * kvd, 1.0), random(&mut rng, 40 * kvd, 1.0), random(&mut rng, 40 * 4 * 64, 1.0));
    let seq = SeqKv { layout: &layout, pages: &ids, start_pos: 0, rows: 0..40, tree: None };
    let write = KvWrite { seq: &seq, layer: 0, k_scale: 1.0, v_scale: 1.0 };
    c.write_kv(&write, &k, &v);
    let host = all_bytes(&c, &layout, 0, 4);
    for (i, id) in ids.iter().enumerate() {
        let page = &host[i * layout.page_bytes()..(i + 1) * layout.page_bytes()];
        reader.write_page_bytes(&layout, PageId::new(1, id.index), 0, page).unwrap();
    }
    g.check_pages(&ids).unwrap();
    let shape = AttnShape { layer: 0, n_heads: 4, n_kv_heads: 2, head_dim: 64, scale: 0.125 };
    let (mut go, mut co) = (GpuBuf::default(), vec![0.0; 40 * 4 * 64]);
    g.grow(&mut go, co.len());
    g.attention(&shape, &seq, &up(&g, &q), &mut go);
    c.attention(&shape, &seq, &q, &mut co);
    assert_close("attention over host-written pages", &down(&g, &go, co.len()), &co, |_| 1e-5);
    // The GPU's writes reach the host pages by the flush at the latest.
    let (k2, v2) = (random(&mut rng, 8 * kvd, 1.0), random(&mut rng, 8 * kvd, 1.0));
    let seq = SeqKv { layout: &layout, pages: &ids, start_pos: 40, rows: 0..8, tree: None };
    let write = KvWrite { seq: &seq, layer: 0, k_scale: 1.0, v_scale: 1.0 };
    g.write_kv(&write, &up(&g, &k2), &up(&g, &v2));
    c.write_kv(&write, &k2, &v2);
    g.flush_pages(&ids).unwrap();
    assert_eq!(all_bytes(&reader, &layout, 1, 4), all_bytes(&c, &layout, 0, 4), "host pages after the flush");
    eprintln!("KV residency: {:?}", g.kv_residency());
}
