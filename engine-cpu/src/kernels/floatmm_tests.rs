//! Float matmul tests: every kernel set against an f64 product and the one-row kernel's bits.

use super::super::SimdCeiling;
use super::*;

#[test]
fn the_register_reduction_adds_the_same_pairs_as_the_reference() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        for seed in 0..200u32 {
            let lanes: [f32; LANES] = std::array::from_fn(|l| {
                let v = (seed.wrapping_mul(2654435761).wrapping_add(l as u32 * 40503)) % 100_003;
                (v as f32 - 50_000.0) * 1.37e-3 * if l % 3 == 0 { 1e4 } else { 1.0 }
            });
            // SAFETY: AVX2 and FMA checked above.
            let got = unsafe { avx2::reduce_lanes(&lanes) };
            assert_eq!(got.to_bits(), reduce(&lanes).to_bits(), "{lanes:?}");
        }
    }
}

/// Every kernel set this CPU has: the blocked form (several column blocks, a column tail,
/// a partial last panel, every tile height) gives exactly the direct form's bits, row by
/// row, for 1 and 2 threads; and all sets agree with an f64 product.
#[test]
fn blocked_form_gives_the_direct_forms_bits_on_every_kernel_set() {
    let (rows, cols) = (29, 2 * KC + 16 * 3 + 5);
    let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 257) as f32 - 128.0) / 97.0).collect();
    let bf = FloatMatrix { rows, cols, data: w.iter().map(|&v| Bf16((v.to_bits() >> 16) as u16)).collect() };
    let one = ThreadPool::new(1);
    let two = ThreadPool::new(2);
    for m in [4, 5, 7, 12] {
        let x: Vec<f32> = (0..m * cols).map(|i| ((i * 31 % 61) as f32 - 30.0) / 17.0).collect();
        for ceiling in [SimdCeiling::Scalar, SimdCeiling::Avx2, SimdCeiling::Detected] {
            let mut all = vec![0f32; m * rows];
            matmul_float_capped(ceiling, &two, &bf, &x, m, &mut all);
            for mi in 0..m {
                let mut single = vec![0f32; rows];
                matmul_float_capped(ceiling, &one, &bf, &x[mi * cols..], 1, &mut single);
                assert_eq!(&single[..], &all[mi * rows..(mi + 1) * rows], "{ceiling:?} m {m} row {mi}");
                for o in 0..rows {
                    let want: f64 =
                        (0..cols).map(|i| x[mi * cols + i] as f64 * bf.data[o * cols + i].widen() as f64).sum();
                    let got = all[mi * rows + o] as f64;
                    assert!((got - want).abs() < 1e-3 * want.abs().max(1.0), "{ceiling:?} {mi} {o}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn matches_a_plain_product_and_is_bit_identical_for_any_row_count_and_threads() {
    let (rows, cols) = (37, 83);
    let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
    let bf = FloatMatrix { rows, cols, data: w.iter().map(|&v| Bf16((v.to_bits() >> 16) as u16)).collect() };
    let fm = FloatMatrix { rows, cols, data: w.clone() };
    let m = 9;
    let x: Vec<f32> = (0..m * cols).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
    let one = ThreadPool::new(1);
    let two = ThreadPool::new(2);
    let mut all = vec![0f32; m * rows];
    matmul_float(&two, &fm, &x, m, &mut all);
    for mi in 0..m {
        for o in 0..rows {
            let want: f64 = (0..cols).map(|i| x[mi * cols + i] as f64 * w[o * cols + i] as f64).sum();
            assert!((all[mi * rows + o] as f64 - want).abs() < 1e-4, "{mi} {o}");
        }
    }
    let mut allb = vec![0f32; m * rows];
    matmul_float(&two, &bf, &x, m, &mut allb);
    for mi in 0..m {
        let mut single = vec![0f32; rows];
        matmul_float(&one, &bf, &x[mi * cols..], 1, &mut single);
        assert_eq!(&single[..], &allb[mi * rows..(mi + 1) * rows], "row {mi}");
    }
}
