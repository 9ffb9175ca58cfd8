//! Every kernel set vs an exact f32 product of the dequantized weights.
//!
//! Tolerances: the only intended error is the Q8 rounding of activations, at most `d_a / 2`
//! per value, so `|got - exact| <= sum_k |w_k| * d_a(k) / 2` (plus 1e-4 relative for float
//! summation order). Kernel sets must agree with the scalar reference to 1e-5 of
//! `sum_k |w_k x_k|`.

use super::*;
use crate::kernels::{Dispatch, available, quant::f32_to_f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub(crate) fn random_matrix(rng: &mut ChaCha8Rng, dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = dtype.row_bytes(cols).unwrap();
    let mut data = vec![0u8; rows * rb];
    rng.fill(&mut data[..]);
    let bb = dtype.block_bytes();
    for blk in data.chunks_exact_mut(bb) {
        let f16 = |x: f32| f32_to_f16(x).to_le_bytes();
        match dtype {
            GgmlType::Q8_0 | GgmlType::Q4_0 => blk[0..2].copy_from_slice(&f16(rng.random_range(0.001..0.05))),
            GgmlType::Q4_1 => {
                blk[0..2].copy_from_slice(&f16(rng.random_range(0.001..0.05)));
                blk[2..4].copy_from_slice(&f16(rng.random_range(-0.3..0.1)));
            }
            GgmlType::F16 => blk.copy_from_slice(&f16(rng.random_range(-1.0..1.0))),
            GgmlType::BF16 => {
                blk.copy_from_slice(&((rng.random_range(-1.0f32..1.0).to_bits() >> 16) as u16).to_le_bytes())
            }
            GgmlType::F32 => blk.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes()),
            GgmlType::Q4_K | GgmlType::Q5_K => {
                blk[0..2].copy_from_slice(&f16(rng.random_range(0.001..0.05)));
                blk[2..4].copy_from_slice(&f16(rng.random_range(0.001..0.05)));
            }
            GgmlType::Q6_K => blk[208..210].copy_from_slice(&f16(rng.random_range(0.001..0.05))),
        }
    }
    data
}

fn exact(w: &QMatrix, x: &[f32], m_rows: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut out = vec![0f32; m_rows * w.rows];
    let mut mag = vec![0f32; m_rows * w.rows];
    let mut bound = vec![0f32; m_rows * w.rows];
    let mut row = vec![0f32; w.cols];
    let acts = Q8Acts::quantize(x, m_rows, w.cols);
    for n in 0..w.rows {
        crate::kernels::dequantize_row(w.dtype, w.row(n), &mut row);
        for m in 0..m_rows {
            let xs = &x[m * w.cols..(m + 1) * w.cols];
            let mut s = 0f64;
            let mut a = 0f32;
            let mut b = 0f32;
            for k in 0..w.cols {
                s += row[k] as f64 * xs[k] as f64;
                a += (row[k] * xs[k]).abs();
                if w.dtype.is_quantized() {
                    b += row[k].abs() * acts.d[m * w.cols / QK + k / QK] * 0.5;
                }
            }
            out[m * w.rows + n] = s as f32;
            mag[m * w.rows + n] = a;
            bound[m * w.rows + n] = b;
        }
    }
    (out, mag, bound)
}

fn run_packed(kern: &Dispatch, pool: &ThreadPool, p: &PackedMatrix, x: &[f32], m_rows: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m_rows * p.rows];
    let acts = Q8Acts::quantize(x, m_rows, p.cols);
    packed_q8_with(kern, pool, p, &acts, &mut out);
    out
}

#[test]
fn every_dtype_and_kernel_set_matches_the_exact_product() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let pool = ThreadPool::new(3);
    let kernels = available();
    let dtypes = [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32];
    for dtype in dtypes {
        for &(rows, cols) in &[(1, 32), (17, 64), (40, 96), (33, 576), (16, 160)] {
            let data = random_matrix(&mut rng, dtype, rows, cols);
            let w = QMatrix { dtype, rows, cols, data: &data };
            let packed = PackedMatrix::pack(&w).unwrap();
            for m_rows in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17] {
                let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-2.0..2.0)).collect();
                let (want, mag, bound) = exact(&w, &x, m_rows);
                let mut got = vec![f32::NAN; m_rows * rows];
                matmul(&pool, &w, &x, m_rows, &mut got);
                let mut got_p = vec![f32::NAN; m_rows * rows];
                matmul_packed(&pool, &packed, &x, m_rows, &mut got_p);
                for i in 0..want.len() {
                    let tol = bound[i] * 1.0001 + 1e-4 * mag[i] + 1e-6;
                    assert!(
                        (got[i] - want[i]).abs() <= tol,
                        "{dtype:?} {rows}x{cols} m={m_rows} i={i}: {} vs {}",
                        got[i],
                        want[i]
                    );
                    assert!(
                        (got_p[i] - want[i]).abs() <= tol,
                        "packed {dtype:?} {rows}x{cols} m={m_rows} i={i}: {} vs {}",
                        got_p[i],
                        want[i]
                    );
                }
                if !dtype.is_quantized() {
                    continue;
                }
                let reference = run_packed(kernels.last().unwrap(), &pool, &packed, &x, m_rows);
                for kern in &kernels {
                    let got_k = run_packed(kern, &pool, &packed, &x, m_rows);
                    for i in 0..want.len() {
                        let tol = 1e-5 * mag[i] + 1e-6;
                        assert!(
                            (got_k[i] - reference[i]).abs() <= tol,
                            "{} {dtype:?} {rows}x{cols} m={m_rows} i={i}: {} vs {}",
                            kern.name,
                            got_k[i],
                            reference[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn pack_rejects_inconsistent_shapes() {
    let data = vec![0u8; 100];
    assert!(PackedMatrix::pack(&QMatrix { dtype: GgmlType::Q4_1, rows: 8, cols: 32, data: &data }).is_none());
    assert!(PackedMatrix::pack(&QMatrix { dtype: GgmlType::Q8_0, rows: 1, cols: 33, data: &data }).is_none());
    assert!(PackedMatrix::pack(&QMatrix { dtype: GgmlType::Q4_1, rows: 5, cols: 32, data: &data }).is_some());
}

#[test]
fn quantizers_agree_with_the_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for kern in available() {
        for _ in 0..200 {
            let x: Vec<f32> = (0..32).map(|_| rng.random_range(-3.0..3.0)).collect();
            let (mut q1, mut q2) = ([0i8; 32], [0i8; 32]);
            let (d1, s1) = crate::kernels::quant::quantize_block_q8_scalar(&x, &mut q1);
            let (d2, s2) = (kern.quantize_q8)(&x, &mut q2);
            assert!((d1 - d2).abs() <= 1e-7 * d1.abs(), "{}", kern.name);
            // rounding of exact halves may differ by one step
            for k in 0..32 {
                assert!((q1[k] as i32 - q2[k] as i32).abs() <= 1, "{}", kern.name);
            }
            assert!((s1 - s2).abs() <= d1 * 32.0, "{}", kern.name);
        }
        let (d, s) = (kern.quantize_q8)(&[0.0; 32], &mut [0i8; 32]);
        assert_eq!((d, s), (0.0, 0.0));
    }
}

#[test]
fn matmul_many_matches_separate_matmuls() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let pool = ThreadPool::new(2);
    let shapes = [(GgmlType::Q4_1, 40), (GgmlType::Q8_0, 16), (GgmlType::Q4_0, 7)];
    let cols = 96;
    let datas: Vec<Vec<u8>> = shapes.iter().map(|&(t, r)| random_matrix(&mut rng, t, r, cols)).collect();
    let ws: Vec<PackedMatrix> = shapes
        .iter()
        .zip(&datas)
        .map(|(&(dtype, rows), d)| PackedMatrix::pack(&QMatrix { dtype, rows, cols, data: d }).unwrap())
        .collect();
    for m_rows in [1, 3, 6] {
        let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        let acts = Q8Acts::quantize(&x, m_rows, cols);
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; m_rows * w.rows]).collect();
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        let wr: Vec<&PackedMatrix> = ws.iter().collect();
        matmul_packed_many(&pool, &wr, &acts, &mut refs);
        for (w, got) in ws.iter().zip(&outs) {
            let mut want = vec![0f32; m_rows * w.rows];
            matmul_packed_q8(&pool, w, &acts, &mut want);
            assert_eq!(got, &want);
        }
    }
}

#[test]
fn every_supported_kernel_set_is_registered_for_the_tests() {
    let names: Vec<&str> = available().iter().map(|d| d.name).collect();
    assert_eq!(names.last(), Some(&"scalar"));
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            assert!(names.contains(&"avx2"), "{names:?}");
        }
        if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw") {
            assert!(names.contains(&"avx512-vnni"), "{names:?}");
        }
    }
}

/// Every output row is computed the same way whatever else is in the call (batching and
/// chunked prefill rely on it being bit-exact): M rows at once == each row alone, for every
/// M-block remainder, every kernel set and thread count.
#[test]
fn each_row_gets_the_same_bits_for_any_m_and_thread_count() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for dtype in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        let (rows, cols) = (40, 96);
        let data = random_matrix(&mut rng, dtype, rows, cols);
        let w = PackedMatrix::pack(&QMatrix { dtype, rows, cols, data: &data }).unwrap();
        let m_max = 11;
        let x: Vec<f32> = (0..m_max * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        for kern in available() {
            let alone: Vec<Vec<u32>> = (0..m_max)
                .map(|m| {
                    let acts = Q8Acts::quantize(&x[m * cols..(m + 1) * cols], 1, cols);
                    let mut out = vec![0f32; rows];
                    packed_q8_with(kern, &ThreadPool::new(1), &w, &acts, &mut out);
                    out.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                for m_rows in 1..=m_max {
                    let acts = Q8Acts::quantize(&x[..m_rows * cols], m_rows, cols);
                    let mut out = vec![0f32; m_rows * rows];
                    packed_q8_with(kern, &pool, &w, &acts, &mut out);
                    for (m, want) in alone.iter().enumerate().take(m_rows) {
                        let got: Vec<u32> = out[m * rows..(m + 1) * rows].iter().map(|v| v.to_bits()).collect();
                        assert!(&got == want, "{} {dtype:?} M={m_rows} threads={threads}: row {m} differs", kern.name);
                    }
                }
            }
        }
    }
}

/// The scalar GEMM as first written: tile-order loops, one row and one activation row at a time.
fn packed_gemm_tile_order(w: &PackedMatrix, a: &Q8Acts, out: &mut [f32]) {
    use crate::kernels::quant::{f16_to_f32, read_u16};
    let nb = w.cols / QK;
    let tb = tile_bytes(w.dtype);
    let data = w.bytes();
    for gi in 0..w.rows.div_ceil(TILE_ROWS) {
        for m in 0..a.m_rows {
            let mut acc = [0f32; TILE_ROWS];
            for b in 0..nb {
                let tile = &data[(gi * nb + b) * tb..][..tb];
                let aq = &a.qs[(m * nb + b) * QK..][..QK];
                let (da, sa) = (a.d[m * nb + b], a.s[m * nb + b]);
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let mut isum = 0i32;
                    let (d, c);
                    if w.dtype == GgmlType::Q8_0 {
                        for k in 0..QK {
                            isum += tile[64 * (k / 4) + 4 * r + k % 4] as i32 * aq[k] as i32;
                        }
                        d = f16_to_f32(read_u16(tile, 512 + 2 * r));
                        c = -128.0 * d;
                    } else {
                        for j in 0..4 {
                            for i in 0..4 {
                                let byte = tile[64 * j + 4 * r + i];
                                isum += (byte & 0x0f) as i32 * aq[8 * j + i] as i32
                                    + (byte >> 4) as i32 * aq[8 * j + 4 + i] as i32;
                            }
                        }
                        d = f16_to_f32(read_u16(tile, 256 + 2 * r));
                        c = if w.dtype == GgmlType::Q4_1 { f16_to_f32(read_u16(tile, 288 + 2 * r)) } else { -8.0 * d };
                    }
                    *acc_r += d * (da * isum as f32) + c * sa;
                }
            }
            let rows = (w.rows - gi * TILE_ROWS).min(TILE_ROWS);
            out[m * w.rows + gi * TILE_ROWS..][..rows].copy_from_slice(&acc[..rows]);
        }
    }
}

#[test]
fn scalar_gemm_gives_the_tile_order_loops_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let pool = ThreadPool::new(2);
    let scalar = available().into_iter().last().expect("scalar");
    assert_eq!(scalar.name, "scalar");
    for dtype in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for &(rows, cols) in &[(1, 32), (17, 64), (40, 96), (33, 576)] {
            let data = random_matrix(&mut rng, dtype, rows, cols);
            let packed = PackedMatrix::pack(&QMatrix { dtype, rows, cols, data: &data }).unwrap();
            for m_rows in [1, 3, 4, 9, 17] {
                let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-2.0..2.0)).collect();
                let got = run_packed(scalar, &pool, &packed, &x, m_rows);
                let mut want = vec![f32::NAN; m_rows * rows];
                packed_gemm_tile_order(&packed, &Q8Acts::quantize(&x, m_rows, cols), &mut want);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{dtype:?} {rows}x{cols} m={m_rows}");
            }
        }
    }
}

/// Reading a row back from the packed tiles gives the GGUF row's dequantized values exactly
/// (embedding lookups of quantized tables rely on it), for every type and a partial tile.
#[test]
fn packed_rows_read_back_as_their_dequantized_gguf_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let dtypes = [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32];
    for dtype in dtypes {
        let (rows, cols) = (19, 96);
        let data = random_matrix(&mut rng, dtype, rows, cols);
        let q = QMatrix { dtype, rows, cols, data: &data };
        let packed = PackedMatrix::pack(&q).unwrap();
        let (mut want, mut got) = (vec![0f32; cols], vec![f32::NAN; cols]);
        for r in 0..rows {
            crate::kernels::dequantize_row(dtype, q.row(r), &mut want);
            assert!(packed.row_f32(r, &mut got));
            assert_eq!(got, want, "{dtype:?} row {r}");
        }
        assert!(!packed.row_f32(rows, &mut got), "row past the end is refused");
        assert!(!packed.row_f32(0, &mut got[..cols - 1]), "wrong output length is refused");
    }
}
