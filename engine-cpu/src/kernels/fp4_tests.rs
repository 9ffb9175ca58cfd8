//! Tolerance of the matmul tests: the reference dequantizes W to f32 exactly as
//! [`Nvfp4Matrix::dequantize`] does and sums in f64. Every kernel forms the same exact products
//! (e2m1 * e4m3 is exact in f32) and differs only in where f32 rounding happens: the global
//! scale applied once at the end instead of per weight, and 16 (AVX-512, scalar) or 8 (AVX2)
//! lane partial sums of `cols/16` (or `cols/8`) terms each, then a tree. The worst-case bound for
//! that summation is `(cols/8 + 8) * 2^-24 * sum|w*x|`; the tests assert twice that, a bound
//! that layout errors (a swapped nibble, a wrong scale) exceed by orders of magnitude.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_matrix(rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> Nvfp4Matrix {
    let mut packed = vec![0u8; rows * cols / 2];
    rng.fill(&mut packed[..]);
    let scales: Vec<u8> = (0..rows * cols / BLOCK)
        .map(|_| match rng.random_range(0..10) {
            0 => rng.random_range(0x00..0x08u8),        // zero and subnormal scales
            1 => rng.random_range(0x00..0x08u8) | 0x80, // negative scales decode fine too
            _ => rng.random_range(0x20..0x58u8),        // 2^-3 .. 2^4 range
        })
        .collect();
    let global = rng.random_range(1e-4f32..1e-2);
    Nvfp4Matrix::new(rows, cols, &packed, &scales, global, Some(0.5)).unwrap()
}

/// `(value, sum |w x|)` per output, in f64 from the dequantized matrix.
fn reference(w: &Nvfp4Matrix, x: &[f32], m_rows: usize) -> Vec<(f64, f64)> {
    let deq = w.dequantize();
    let mut out = Vec::with_capacity(m_rows * w.rows());
    for m in 0..m_rows {
        for o in 0..w.rows() {
            let (mut v, mut a) = (0f64, 0f64);
            for i in 0..w.cols() {
                let p = deq[o * w.cols() + i] as f64 * x[m * w.cols() + i] as f64;
                v += p;
                a += p.abs();
            }
            out.push((v, a));
        }
    }
    out
}

fn assert_close(isa: Fp4Isa, got: &[f32], want: &[(f64, f64)], cols: usize, what: &str) {
    for (i, (&g, &(v, a))) in got.iter().zip(want).enumerate() {
        let tol = 2.0 * (cols as f64 / 8.0 + 8.0) * f32::EPSILON as f64 / 2.0 * a + 1e-30;
        assert!((g as f64 - v).abs() <= tol, "{} {what}: out[{i}] = {g}, reference {v} (tol {tol:e})", isa.name());
    }
}

#[test]
fn e2m1_table_matches_the_format_definition() {
    for c in 0..16u8 {
        let (s, e, m) = (c >> 3, (c >> 1) & 3, (c & 1) as f32);
        let mag = if e == 0 { m * 0.5 } else { (1.0 + m / 2.0) * 2f32.powi(e as i32 - 1) };
        let want = if s == 1 { -mag } else { mag };
        assert_eq!(E2M1_VALUES[c as usize].to_bits(), want.to_bits(), "code {c}");
    }
}

#[test]
fn low_nibble_is_the_even_element_on_every_isa() {
    // row 0: bytes 0x21 -> [0.5, 1.0], 0x9f -> [-6, -0.5], rest 0x43 -> [1.5, 2.0]; scale 2.0 (0x40)
    let mut packed = vec![0x43u8; 8];
    packed[0] = 0x21;
    packed[1] = 0x9f;
    let w = Nvfp4Matrix::new(1, 16, &packed, [0x40], 0.25, None).unwrap();
    let mut row = vec![0f32; 16];
    w.dequantize_row(0, &mut row);
    assert_eq!(&row[..6], &[0.25, 0.5, -3.0, -0.25, 0.75, 1.0]);
    let pool = ThreadPool::new(1);
    for isa in Fp4Isa::available() {
        for k in 0..16 {
            let mut x = vec![0f32; 16];
            x[k] = 1.0;
            let mut out = [0f32; 1];
            matmul_nvfp4_with(isa, &pool, &w, &x, 1, &mut out);
            assert_eq!(out[0], row[k], "{} picks element {k}", isa.name());
        }
    }
}

#[test]
fn every_isa_matches_the_dequantized_reference_on_odd_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let shapes = [
        (1, 16, 1),
        (3, 48, 1),
        (7, 16, 5),
        (37, 144, 1),
        (37, 144, 3),
        (64, 256, 4),
        (129, 1040, 9),
        (33, 64, 17),
        (6, 4096, 2),
    ];
    let isas = Fp4Isa::available();
    eprintln!("nvfp4 isas on this machine: {:?}", isas);
    for &(rows, cols, m_rows) in &shapes {
        let w = random_matrix(&mut rng, rows, cols);
        let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let want = reference(&w, &x, m_rows);
        for &isa in &isas {
            for threads in [1, 3] {
                let pool = ThreadPool::new(threads);
                let mut out = vec![f32::NAN; m_rows * rows];
                matmul_nvfp4_with(isa, &pool, &w, &x, m_rows, &mut out);
                assert_close(isa, &out, &want, cols, &format!("{rows}x{cols} m={m_rows} t={threads}"));
            }
        }
    }
}

#[test]
fn many_matrices_in_one_dispatch_equal_separate_calls() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (cols, m_rows) = (96, 3);
    let ws: Vec<Nvfp4Matrix> = [5, 32, 9].iter().map(|&r| random_matrix(&mut rng, r, cols)).collect();
    let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let pool = ThreadPool::new(2);
    for isa in Fp4Isa::available() {
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; m_rows * w.rows()]).collect();
        let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        let wrefs: Vec<&Nvfp4Matrix> = ws.iter().collect();
        matmul_nvfp4_many_with(isa, &pool, &wrefs, &x, m_rows, &mut refs);
        for (w, got) in ws.iter().zip(&outs) {
            let mut single = vec![0f32; m_rows * w.rows()];
            matmul_nvfp4_with(isa, &pool, w, &x, m_rows, &mut single);
            assert_eq!(got, &single, "{}", isa.name());
        }
    }
}

#[test]
fn nan_block_scale_poisons_only_its_row() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut w = random_matrix(&mut rng, 5, 32);
    w.scales[2 * 2 + 1] = 0x7f; // row 2, block 1
    let x = vec![1.0f32; 2 * 32];
    let pool = ThreadPool::new(1);
    for isa in Fp4Isa::available() {
        let mut out = vec![0f32; 2 * 5];
        matmul_nvfp4_with(isa, &pool, &w, &x, 2, &mut out);
        for m in 0..2 {
            for o in 0..5 {
                assert_eq!(out[m * 5 + o].is_nan(), o == 2, "{} m={m} o={o}", isa.name());
            }
        }
    }
}

#[test]
fn shape_errors_are_reported() {
    assert_eq!(Nvfp4Matrix::new(2, 24, [0; 24], [0; 2], 1.0, None).unwrap_err(), Nvfp4Error::Cols { cols: 24 });
    assert_eq!(
        Nvfp4Matrix::new(2, 32, [0; 31], [0; 4], 1.0, None).unwrap_err(),
        Nvfp4Error::PackedLen { rows: 2, cols: 32, got: 31, want: 32 }
    );
    assert_eq!(
        Nvfp4Matrix::new(2, 32, [0; 32], [0; 3], 1.0, None).unwrap_err(),
        Nvfp4Error::ScalesLen { rows: 2, cols: 32, got: 3, want: 4 }
    );
    assert!(matches!(Nvfp4Matrix::new(2, 32, [0; 32], [0; 4], f32::NAN, None), Err(Nvfp4Error::GlobalScale(_))));
}

#[test]
fn e2m1_rounding_is_nearest_with_ties_to_the_even_code() {
    let cases = [
        (0.25, 0),
        (0.26, 1),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (2.51, 5),
        (3.5, 6),
        (5.0, 6),
        (5.01, 7),
        (100.0, 7),
        (-0.75, 10),
        (-0.0, 8),
    ];
    for (v, code) in cases {
        assert_eq!(e2m1_code(v), code, "{v}");
    }
    for c in 0..16u8 {
        assert_eq!(e2m1_code(E2M1_VALUES[c as usize]), c);
    }
}

#[test]
fn quantizing_an_exactly_representable_matrix_gives_back_its_bytes() {
    // power-of-two global, every block holding a +-6 code, one block at the largest scale:
    // then amax/2688 == global and every block scale and code is recovered exactly
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (rows, cols) = (9, 64);
    let mut packed = vec![0u8; rows * cols / 2];
    rng.fill(&mut packed[..]);
    for blk in packed.chunks_exact_mut(8) {
        blk[3] = (blk[3] & 0xf0) | if blk[3] & 1 == 0 { 0x7 } else { 0xf };
    }
    let mut scales: Vec<u8> = (0..rows * cols / BLOCK).map(|_| rng.random_range(0x08..0x7e)).collect();
    scales[5] = 0x7e;
    let w = Nvfp4Matrix::new(rows, cols, &packed, &scales, 2f32.powi(-12), None).unwrap();
    let q = Nvfp4Matrix::quantize(rows, cols, &w.dequantize()).unwrap();
    assert_eq!(q.global_scale(), w.global_scale());
    assert_eq!(q.scales(), w.scales());
    assert_eq!(q.packed(), w.packed());
}

#[test]
fn quantization_error_is_bounded_by_half_the_largest_code_gap() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (rows, cols) = (16, 128);
    let w: Vec<f32> =
        (0..rows * cols).map(|_| rng.random_range(-1.0f32..1.0) * rng.random_range(0.0f32..1.0)).collect();
    let q = Nvfp4Matrix::quantize(rows, cols, &w).unwrap();
    let d = q.dequantize();
    for (bi, (wb, db)) in w.chunks_exact(BLOCK).zip(d.chunks_exact(BLOCK)).enumerate() {
        let step = E4M3_TO_F32[q.scales()[bi] as usize] * q.global_scale();
        for (&a, &b) in wb.iter().zip(db) {
            // the largest gap between E2M1 values is 2 (4 -> 6); the scale rounding can push a
            // value up to 1/16 past 6 steps, still within one step of 6
            assert!((a - b).abs() <= step * 1.0001, "block {bi}: {a} -> {b} (step {step})");
        }
    }
}

/// Prefill-sized products run the blocked kernels (several column blocks, partial panels,
/// every tile height); each row must get exactly the bits the one-row (direct) kernel gives
/// it on the same kernel set, since the model's pass-split exactness relies on it.
#[test]
fn blocked_kernels_give_the_direct_kernels_bits_row_by_row() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for &(rows, cols, m_rows) in &[(37, 1040, 4), (13, 1536, 7), (8, 2048, 12)] {
        let w = random_matrix(&mut rng, rows, cols);
        let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        for isa in Fp4Isa::available() {
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                let mut all = vec![f32::NAN; m_rows * rows];
                matmul_nvfp4_with(isa, &pool, &w, &x, m_rows, &mut all);
                for m in 0..m_rows {
                    let mut one = vec![f32::NAN; rows];
                    matmul_nvfp4_with(isa, &pool, &w, &x[m * cols..(m + 1) * cols], 1, &mut one);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&one),
                        bits(&all[m * rows..(m + 1) * rows]),
                        "{isa:?} {rows}x{cols} m={m} t={threads}"
                    );
                }
            }
        }
    }
}
