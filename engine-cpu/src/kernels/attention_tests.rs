//! Attention vs a naive f32 implementation over a LocalPagePool, for every kernel set.
//!
//! The reference uses the same f16-rounded K/V the pages hold, so the only differences are
//! float summation order and the exp approximation of SIMD paths: outputs (magnitude ~1)
//! must agree to 2e-4 absolute. FP8 pages run the same checks with E4M3-rounded K/V.

use super::*;
use crate::kernels::fp8::{E4M3_TO_F32, f32_to_e4m3};
use crate::kernels::{available, quant::f16_to_f32};
use crate::pages::LocalPagePool;
use engine_ops::kv::KvDtype;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Fixture {
    pool: LocalPagePool,
    pages: Vec<PageAddr>,
    /// `[layer][pos][n_kv*hd]`, rounded to the page dtype.
    k: Vec<Vec<Vec<f32>>>,
    v: Vec<Vec<Vec<f32>>>,
}

fn fixture(rng: &mut ChaCha8Rng, layout: KvLayout, positions: usize) -> Fixture {
    let n_pages = positions.div_ceil(layout.page_tokens);
    let mut pool = LocalPagePool::new(layout, n_pages + 1);
    let pages: Vec<PageAddr> = pool.allocate(n_pages).unwrap().into_iter().map(|(_, p)| p).collect();
    let row = layout.n_kv_heads * layout.head_dim;
    let round = |x: f32| match layout.dtype {
        KvDtype::F16 => f16_to_f32(super::f32_to_f16(x)),
        KvDtype::Fp8 => E4M3_TO_F32[f32_to_e4m3(x) as usize],
    };
    let mut k = vec![vec![]; layout.n_layers];
    let mut v = vec![vec![]; layout.n_layers];
    for layer in 0..layout.n_layers {
        for pos in 0..positions {
            let kr: Vec<f32> = (0..row).map(|_| rng.random_range(-1.5f32..1.5)).collect();
            let vr: Vec<f32> = (0..row).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            write_kv(&layout, &pages, layer, pos, &kr, &vr);
            k[layer].push(kr.into_iter().map(round).collect());
            v[layer].push(vr.into_iter().map(round).collect());
        }
    }
    Fixture { pool, pages, k, v }
}

fn naive(f: &Fixture, p: &AttnParams, start_pos: usize, q: &[f32], n_q: usize) -> Vec<f32> {
    let hd = p.head_dim;
    let g = p.n_heads / p.n_kv_heads;
    let mut out = vec![0f32; n_q * p.n_heads * hd];
    for i in 0..n_q {
        for h in 0..p.n_heads {
            let kvh = h / g;
            let qh = &q[(i * p.n_heads + h) * hd..][..hd];
            let n_keys = start_pos + i + 1;
            let s: Vec<f64> = (0..n_keys)
                .map(|t| {
                    (0..hd).map(|d| qh[d] as f64 * f.k[p.layer][t][kvh * hd + d] as f64).sum::<f64>() * p.scale as f64
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                let o: f64 = (0..n_keys).map(|t| e[t] * f.v[p.layer][t][kvh * hd + d] as f64).sum();
                out[(i * p.n_heads + h) * hd + d] = (o / sum) as f32;
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_for_every_kernel_set() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let cases = [
        // (page_tokens, head_dim, n_heads, n_kv_heads, start_pos, n_q)
        (16, 64, 9, 3, 0, 1),
        (16, 64, 9, 3, 40, 1),
        (16, 64, 9, 3, 700, 1),
        (16, 64, 9, 3, 37, 13),
        (12, 32, 4, 2, 50, 7),
        (32, 64, 6, 6, 300, 3),
        (8, 16, 8, 1, 5, 20),
        // stacked query blocks whose keys are also split across threads
        (16, 64, 9, 3, 500, 2),
        (16, 32, 2, 1, 400, 5),
        // wide (rows-in-lanes) kernel: two query blocks; and with split keys
        (16, 64, 9, 3, 300, 40),
        (16, 64, 8, 1, 600, 2),
        // Qwen3.6's heads (256 dims, 4 per KV head): decode, stacked and wide
        (16, 256, 8, 2, 90, 1),
        (16, 256, 8, 2, 70, 9),
    ];
    let with_dtypes = cases.iter().flat_map(|c| [(c, KvDtype::F16), (c, KvDtype::Fp8)]);
    for (&(pt, hd, nh, nkv, start_pos, n_q), dtype) in with_dtypes {
        let layout = KvLayout { n_layers: 2, n_kv_heads: nkv, head_dim: hd, page_tokens: pt, dtype };
        let f = fixture(&mut rng, layout, start_pos + n_q);
        let p = AttnParams { layer: 1, n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
        let q: Vec<f32> = (0..n_q * nh * hd).map(|_| rng.random_range(-2.0..2.0)).collect();
        let want = naive(&f, &p, start_pos, &q, n_q);
        for threads in [1, 2, 3] {
            let tp = ThreadPool::new(threads);
            for kern in available() {
                let mut out = vec![f32::NAN; want.len()];
                attention_with(kern, &tp, &layout, &f.pages, &p, start_pos, None, &q, n_q, &mut out);
                for i in 0..want.len() {
                    assert!(
                        (out[i] - want[i]).abs() <= 2e-4,
                        "{} {dtype:?} pt={pt} hd={hd} start={start_pos} n_q={n_q} threads={threads} i={i}: {} vs {}",
                        kern.name,
                        out[i],
                        want[i]
                    );
                }
            }
        }
        assert_eq!(f.pool.free_pages(), 1);
    }
}

#[test]
fn write_kv_places_rows_at_the_layout_offsets() {
    let layout = KvLayout { n_layers: 3, n_kv_heads: 2, head_dim: 4, page_tokens: 4, dtype: KvDtype::F16 };
    let mut pool = LocalPagePool::new(layout, 2);
    let pages: Vec<PageAddr> = pool.allocate(2).unwrap().into_iter().map(|(_, p)| p).collect();
    let k = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let v = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0];
    write_kv(&layout, &pages, 2, 6, &k, &v);
    let read = |part: KvPart, h: usize, d: usize| unsafe {
        let off = layout.block_offset_bytes(2, part, h) + (2 * 4 + d) * 2;
        f16_to_f32(*(pages[1].as_ptr().add(off) as *const u16))
    };
    assert_eq!(read(KvPart::Key, 1, 3), 8.0);
    assert_eq!(read(KvPart::Value, 0, 0), -1.0);
    assert_eq!(read(KvPart::Value, 1, 2), -7.0);
}

#[test]
fn fp8_pages_are_half_size_and_store_scaled_saturated_e4m3() {
    let f16 = KvLayout { n_layers: 3, n_kv_heads: 2, head_dim: 4, page_tokens: 4, dtype: KvDtype::F16 };
    let layout = KvLayout { dtype: KvDtype::Fp8, ..f16 };
    assert_eq!(2 * layout.page_bytes(), f16.page_bytes());
    assert_eq!(layout.bytes_per_token(), 3 * 2 * 2 * 4);
    let mut pool = LocalPagePool::new(layout, 2);
    let pages: Vec<PageAddr> = pool.allocate(2).unwrap().into_iter().map(|(_, p)| p).collect();
    let k = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1000.0];
    let v = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, 0.3];
    write_kv_scaled(&layout, &pages, 2, 6, &k, &v, 2.0, 0.5);
    let read = |part: KvPart, h: usize, d: usize| unsafe {
        let off = layout.block_offset_bytes(2, part, h) + 2 * 4 + d;
        E4M3_TO_F32[*pages[1].as_ptr().add(off) as usize]
    };
    // stored = E4M3(x / scale): 8 / 2 = 4, 1000 / 2 saturates at 448, -2 / 0.5 = -4
    assert_eq!(read(KvPart::Key, 1, 2), 3.5);
    assert_eq!(read(KvPart::Key, 1, 3), 448.0);
    assert_eq!(read(KvPart::Value, 0, 1), -4.0);
    // 0.3 / 0.5 = 0.6 rounds to the nearest E4M3 value 0.625
    assert_eq!(read(KvPart::Value, 1, 3), 0.625);
}

/// Every E4M3 value is exactly an f16 value, so decoding through f16 loses nothing.
#[test]
fn e4m3_to_f16_table_is_exact() {
    let t = super::e4m3_f16_table();
    for b in 0..=255u8 {
        let (want, got) = (E4M3_TO_F32[b as usize], f16_to_f32(t[b as usize]));
        assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()), "byte {b:#x}: {want} vs {got}");
    }
    // The SIMD decode (when present) gives the table's bits, every code, with a ragged tail.
    let src: Vec<u8> = (0..=255u8).chain(0..=20).collect();
    let mut got = vec![0u16; src.len()];
    // SAFETY: `src` has `src.len()` bytes, `got` as many slots.
    unsafe { super::decode_fp8_rows(src.as_ptr(), 1, src.len(), &mut got) };
    for (i, (&b, &h)) in src.iter().zip(&got).enumerate() {
        let want = t[b as usize];
        let nan = |x: u16| (x & 0x7c00) == 0x7c00 && (x & 0x3ff) != 0;
        assert!(
            h == want || (nan(h) && nan(want) && (h ^ want) & 0x8000 == 0),
            "value {i} (byte {b:#x}): {h:#x} vs {want:#x}"
        );
    }
}

/// Rows of `out` (`[n_q][row]`) as f32 bits.
fn bits(out: &[f32]) -> Vec<u32> {
    out.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_query_gets_the_same_bits_under_any_chunking_and_thread_count() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // (page_tokens, head_dim, n_heads, n_kv_heads, positions): several segments, pages that
    // are and are not multiples of the 16-key chunk, GQA groups from 1 to 8.
    let cases =
        [(16, 64, 9, 3, 600), (12, 32, 4, 2, 530), (32, 64, 8, 1, 300), (8, 16, 2, 2, 70), (16, 256, 8, 2, 150)];
    let with_dtypes = cases.iter().flat_map(|c| [(c, KvDtype::F16), (c, KvDtype::Fp8)]);
    for (&(pt, hd, nh, nkv, n), dtype) in with_dtypes {
        let layout = KvLayout { n_layers: 1, n_kv_heads: nkv, head_dim: hd, page_tokens: pt, dtype };
        let f = fixture(&mut rng, layout, n);
        let p = AttnParams { layer: 0, n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
        let row = nh * hd;
        let q: Vec<f32> = (0..n * row).map(|_| rng.random_range(-2.0..2.0)).collect();
        let mut random_cuts = Vec::new();
        let mut at = 0;
        while at < n {
            let len = rng.random_range(1..=80usize).min(n - at);
            random_cuts.push(len);
            at += len;
        }
        let chunkings: Vec<(&str, Vec<usize>)> =
            vec![("one token at a time", vec![1; n]), ("7 + rest", vec![7, n - 7]), ("random", random_cuts)];
        for kern in available() {
            let one = ThreadPool::new(1);
            let mut base = vec![f32::NAN; n * row];
            attention_with(kern, &one, &layout, &f.pages, &p, 0, None, &q, n, &mut base);
            let base = bits(&base);
            for threads in [1, 2, 3] {
                let tp = ThreadPool::new(threads);
                let mut whole = vec![f32::NAN; n * row];
                attention_with(kern, &tp, &layout, &f.pages, &p, 0, None, &q, n, &mut whole);
                assert!(bits(&whole) == base, "{} pt={pt} hd={hd}: one shot on {threads} threads differs", kern.name);
                for (what, cuts) in &chunkings {
                    let mut out = vec![f32::NAN; n * row];
                    let mut start = 0;
                    for &len in cuts {
                        let r = start * row..(start + len) * row;
                        attention_with(kern, &tp, &layout, &f.pages, &p, start, None, &q[r.clone()], len, &mut out[r]);
                        start += len;
                    }
                    let got = bits(&out);
                    if let Some(i) = (0..n * row).find(|&i| got[i] != base[i]) {
                        let (k, q) = (kern.name, i / row);
                        panic!("{k} {dtype:?} pt={pt} hd={hd} threads={threads} {what}: query {q} differs");
                    }
                }
            }
        }
    }
}

#[test]
fn wide_kernel_gives_each_row_the_chunk_kernels_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for hd in [16, 32, 64, 128, 256] {
        let layout = KvLayout { n_layers: 1, n_kv_heads: 1, head_dim: hd, page_tokens: 16, dtype: KvDtype::F16 };
        let n_keys = 16 * 5 + 9;
        let f = fixture(&mut rng, layout, n_keys);
        for kern in available() {
            let Some(wide) = kern.attn_wide else { continue };
            // 37 rows: two full lane blocks and a partial one; a nonempty starting state.
            let rows = 37;
            let q: Vec<f32> = (0..rows * hd).map(|_| rng.random_range(-0.5..0.5)).collect();
            let mut st = State::new(rows, hd);
            for r in 0..rows {
                st.m[r] = if r % 3 == 0 { f32::NEG_INFINITY } else { rng.random_range(-1.0..1.0) };
                st.l[r] = if r % 3 == 0 { 0.0 } else { rng.random_range(0.5..2.0) };
                for d in 0..hd {
                    st.acc[r * hd + d] = if r % 3 == 0 { 0.0 } else { rng.random_range(-1.0..1.0) };
                }
            }
            let mut by_row = State::new(rows, hd);
            by_row.m.copy_from_slice(&st.m);
            by_row.l.copy_from_slice(&st.l);
            by_row.acc.copy_from_slice(&st.acc);
            let mut chunks = Vec::new();
            collect_chunks(&layout, &f.pages, 0, 0, 0..n_keys, &mut chunks, &mut Vec::new());
            let mut qt = Vec::new();
            transpose_rows(&q, rows, hd, &mut qt);
            let mut ws = WideState::new(rows, hd);
            ws.reset(rows);
            ws.set_rows(0, hd, &st);
            // SAFETY: the chunks point into the fixture's pages.
            unsafe { wide(&chunks, &qt, rows.div_ceil(16), hd, &mut ws) };
            ws.get_rows(0, hd, &mut st);
            for r in 0..rows {
                let mut one = State::new(1, hd);
                one.m[0] = by_row.m[r];
                one.l[0] = by_row.l[r];
                one.acc.copy_from_slice(&by_row.acc[r * hd..(r + 1) * hd]);
                let qr = &q[r * hd..(r + 1) * hd];
                walk_keys(kern.attn_chunk, &layout, &f.pages, 0, 0, 0..n_keys, qr, 1, &mut one, &mut Vec::new());
                assert_eq!(st.m[r].to_bits(), one.m[0].to_bits(), "{} hd={hd} row {r}: max", kern.name);
                assert_eq!(st.l[r].to_bits(), one.l[0].to_bits(), "{} hd={hd} row {r}: sum", kern.name);
                assert!(bits(&st.acc[r * hd..(r + 1) * hd]) == bits(&one.acc), "{} hd={hd} row {r}: acc", kern.name);
            }
        }
    }
}

#[test]
fn query_blocks_fill_whole_vectors_and_leave_small_tails_to_the_stacked_kernel() {
    let shape = |n_q, g, wide| -> Vec<(usize, usize, bool)> {
        query_blocks(n_q, g, wide).iter().map(|b| (b.i0, b.i1, b.wide)).collect()
    };
    // GQA group of 3 (SmolLM2): 16 lanes hold 5 queries.
    assert_eq!(shape(1, 3, true), vec![(0, 1, false)]);
    assert_eq!(shape(2, 3, true), vec![(0, 2, false)]);
    assert_eq!(shape(3, 3, true), vec![(0, 3, true)]);
    assert_eq!(shape(5, 3, true), vec![(0, 5, true)]);
    assert_eq!(shape(6, 3, true), vec![(0, 5, true), (5, 6, false)]);
    assert_eq!(shape(7, 3, true), vec![(0, 5, true), (5, 7, false)]);
    assert_eq!(shape(8, 3, true), vec![(0, 8, true)]);
    assert_eq!(shape(16, 3, true), vec![(0, 16, true)]);
    assert_eq!(shape(17, 3, true), vec![(0, 16, true), (16, 17, false)]);
    // Blocks of about MAX_WIDE_ROWS (128) rows: two 48-row units of 16 queries.
    assert_eq!(shape(40, 3, true), vec![(0, 32, true), (32, 40, true)]);
    assert_eq!(shape(90, 3, true), vec![(0, 32, true), (32, 64, true), (64, 90, true)]);
    // Without a wide kernel: stacked blocks of at most MAX_STACKED_HEADS rows.
    assert_eq!(shape(5, 3, false), vec![(0, 2, false), (2, 4, false), (4, 5, false)]);
    // Groups that divide 16, and one wider than a vector.
    assert_eq!(shape(4, 4, true), vec![(0, 4, true)]);
    assert_eq!(shape(6, 4, true), vec![(0, 4, true), (4, 6, false)]);
    assert_eq!(shape(3, 32, true), vec![(0, 3, true)]);
    assert_eq!(shape(5, 32, true), vec![(0, 4, true), (4, 5, true)]);
    // Every query lands in exactly one block, in order.
    for g in 1..=12 {
        for n in 1..200 {
            let b = query_blocks(n, g, true);
            assert_eq!(b.first().map(|b| b.i0), Some(0));
            assert_eq!(b.last().map(|b| b.i1), Some(n));
            assert!(b.windows(2).all(|w| w[0].i1 == w[1].i0 && w[0].i0 < w[0].i1));
        }
    }
}
