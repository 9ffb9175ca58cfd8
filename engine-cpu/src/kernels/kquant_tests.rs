//! K-quant kernels against llama.cpp's gguf-py (`tests/fixtures/kquant`, made by
//! scripts/reference/make_kquant_reference.py), against exact products of the dequantized
//! codes, and every kernel set against the scalar reference, bit for bit.

use super::*;

fn fixture(dtype: KQuantType) -> (KQuantMatrix, Vec<f32>) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kquant");
    let bytes = std::fs::read(dir.join(format!("{}.bin", dtype.name()))).expect("fixture bytes");
    let values: Vec<f32> = std::fs::read(dir.join(format!("{}.f32", dtype.name())))
        .expect("fixture values")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let cols = 512;
    let rows = values.len() / cols;
    (KQuantMatrix::with_layout(dtype, rows, cols, &bytes, Layout::File).expect("fixture shape"), values)
}

/// File-layout bytes of `rows` x `cols` with every code pattern (pseudo-random bytes) and
/// block scales small enough to stay finite.
fn random_bytes(dtype: KQuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut data: Vec<u8> = (0..rows * cols / QK_K * dtype.block_bytes())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    for (i, blk) in data.chunks_exact_mut(dtype.block_bytes()).enumerate() {
        let d = |k: usize| half::f16::from_f32(0.001 + 0.0007 * ((i * 7 + k) % 13) as f32).to_bits().to_le_bytes();
        match dtype {
            KQuantType::Q6K => blk[208..210].copy_from_slice(&d(0)),
            _ => {
                blk[0..2].copy_from_slice(&d(0));
                blk[2..4].copy_from_slice(&d(1));
            }
        }
    }
    data
}

const TYPES: [KQuantType; 3] = [KQuantType::Q4K, KQuantType::Q5K, KQuantType::Q6K];

#[test]
fn dequantization_matches_gguf_py_value_for_value() {
    for dtype in TYPES {
        let (w, want) = fixture(dtype);
        let mut row = vec![0f32; w.cols];
        for r in 0..w.rows {
            w.dequantize_row(r, &mut row);
            for (i, (&got, &want)) in row.iter().zip(&want[r * w.cols..]).enumerate() {
                // Same operations in f32; allow one rounding of difference.
                assert!((got - want).abs() <= want.abs() * 2e-7, "{} row {r} value {i}: {got} vs {want}", dtype.name());
            }
        }
    }
}

#[test]
fn packed_scales_and_mins_unpack_like_the_reference() {
    let mut state = 0x1234_5678_9abc_def0u64;
    for _ in 0..1000 {
        let mut packed = [0u8; 12];
        for b in &mut packed {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *b = (state >> 56) as u8;
        }
        let (sc, mn) = scales_mins(&packed);
        for j in 0..8 {
            assert_eq!((sc[j], mn[j]), scale_min(j, &packed), "{packed:?} sub-block {j}");
        }
    }
}

fn activations(m: usize, cols: usize, seed: usize) -> Vec<f32> {
    (0..m * cols).map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 41.0 * (1.0 + (i % 7) as f32)).collect()
}

/// Every kernel set this CPU has, named (the scalar reference first).
fn kernels() -> Vec<(&'static str, RowsKernel)> {
    #[allow(unused_mut)] // (pushed to on aarch64)
    let mut v: Vec<(&'static str, RowsKernel)> = vec![("scalar", rows_scalar)];
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push(("neon", neon::rows_neon));
        }
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push(("neon-dotprod", neon::rows_neon_dotprod));
        }
    }
    v
}

#[test]
fn integer_dots_equal_the_exact_product_of_the_dequantized_codes() {
    for dtype in TYPES {
        let (w, deq) = fixture(dtype);
        let m = 3;
        let x = activations(m, w.cols, 1);
        let acts = Q8KActs::quantize(&ThreadPool::new(1), &x, m, w.cols);
        let mut got = vec![f32::NAN; m * w.rows];
        matmul_kquant_q8k_with(&ThreadPool::new(1), rows_scalar, &w, &acts, &mut got);
        let nb = w.cols / QK_K;
        for mi in 0..m {
            for o in 0..w.rows {
                let (mut want, mut mag) = (0f64, 0f64);
                for i in 0..w.cols {
                    let a = acts.qs[mi * w.cols + i] as f64 * acts.d[mi * nb + i / QK_K] as f64;
                    want += deq[o * w.cols + i] as f64 * a;
                    mag += (deq[o * w.cols + i] as f64 * a).abs();
                }
                let g = got[mi * w.rows + o] as f64;
                assert!((g - want).abs() <= 1e-5 * mag, "{} m {mi} row {o}: {g} vs {want} (scale {mag})", dtype.name());
            }
        }
        // And against the unquantized activations, within the 8-bit rounding.
        for mi in 0..m {
            for o in 0..w.rows {
                let exact: f64 = (0..w.cols).map(|i| deq[o * w.cols + i] as f64 * x[mi * w.cols + i] as f64).sum();
                let mag: f64 =
                    (0..w.cols).map(|i| (deq[o * w.cols + i] as f64 * x[mi * w.cols + i] as f64).abs()).sum();
                let g = got[mi * w.rows + o] as f64;
                assert!((g - exact).abs() <= 1e-2 * mag, "{} m {mi} row {o}: {g} vs {exact}", dtype.name());
            }
        }
    }
}

#[test]
fn every_kernel_set_gives_the_scalar_bits_for_any_rows_and_threads() {
    for dtype in TYPES {
        let (w, _) = fixture(dtype);
        for m in [1, 2, 4, 5, 9, 17] {
            let x = activations(m, w.cols, m);
            let acts = Q8KActs::quantize(&ThreadPool::new(2), &x, m, w.cols);
            let mut want = vec![f32::NAN; m * w.rows];
            matmul_kquant_q8k_with(&ThreadPool::new(1), rows_scalar, &w, &acts, &mut want);
            for (name, kernel) in kernels() {
                for threads in [1, 2, 3] {
                    let mut got = vec![f32::NAN; m * w.rows];
                    matmul_kquant_q8k_with(&ThreadPool::new(threads), kernel, &w, &acts, &mut got);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{} {name} m={m} threads={threads}",
                        dtype.name()
                    );
                }
                // One activation row at a time (decode) gives each row the same bits.
                for mi in 0..m {
                    let one = Q8KActs::quantize(&ThreadPool::new(1), &x[mi * w.cols..(mi + 1) * w.cols], 1, w.cols);
                    let mut got = vec![f32::NAN; w.rows];
                    matmul_kquant_q8k_with(&ThreadPool::new(2), kernel, &w, &one, &mut got);
                    assert_eq!(got, want[mi * w.rows..(mi + 1) * w.rows], "{} {name} row {mi}", dtype.name());
                }
            }
        }
    }
}

#[test]
fn extreme_codes_do_not_saturate_on_any_kernel_set() {
    // Every weight code at its maximum (all bits set) against activations at +-127: the
    // largest i16 pair sums the SIMD kernels form. Scales are the largest the formats allow.
    for dtype in TYPES {
        let bb = dtype.block_bytes();
        let mut blk = vec![0xffu8; bb];
        let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
        match dtype {
            KQuantType::Q6K => {
                blk[192..208].fill(0x80); // scales -128
                blk[208..210].copy_from_slice(&one);
            }
            _ => {
                blk[0..2].copy_from_slice(&one);
                blk[2..4].copy_from_slice(&one);
            }
        }
        let cols = 2 * QK_K;
        let data: Vec<u8> = (0..3 * cols / QK_K).flat_map(|_| blk.clone()).collect();
        let w = KQuantMatrix::with_layout(dtype, 3, cols, &data, Layout::File).expect("shape");
        let grouped = KQuantMatrix::with_layout(dtype, 3, cols, &data, Layout::Grouped).expect("shape");
        let mut deq = vec![0f32; cols];
        w.dequantize_row(0, &mut deq);
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..cols).map(|i| if i % 3 == 0 { -sign } else { sign }).collect();
            let acts = Q8KActs::quantize(&ThreadPool::new(1), &x, 1, cols);
            let want: f64 = deq.iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
            let mut results = Vec::new();
            for (name, kernel) in kernels() {
                let mut got = vec![0f32; 3];
                matmul_kquant_q8k_with(&ThreadPool::new(1), kernel, &w, &acts, &mut got);
                results.push((name, got[0]));
            }
            for (name, kernel) in grouped_kernels() {
                let mut got = vec![0f32; 3];
                grouped::matmul(&ThreadPool::new(1), kernel, &grouped, &acts, &mut got);
                results.push((name, got[0]));
            }
            for (name, got) in results {
                assert!((got as f64 - want).abs() <= 1e-5 * want.abs(), "{} {name}: {got} vs {want}", dtype.name());
            }
        }
    }
}

#[test]
fn q8k_quantization_error_is_within_half_a_step_and_sums_are_exact() {
    let cols = 2 * QK_K;
    let x = activations(2, cols, 5);
    let a = Q8KActs::quantize(&ThreadPool::new(2), &x, 2, cols);
    for (i, &v) in x.iter().enumerate() {
        let d = a.d[i / QK_K];
        assert!((a.qs[i] as f32 * d - v).abs() <= d * 0.5 + 1e-6, "value {i}");
    }
    for (t, &s) in a.bsums.iter().enumerate() {
        let want: i32 = a.qs[t * BSUM_VALUES..(t + 1) * BSUM_VALUES].iter().map(|&q| q as i32).sum();
        assert_eq!(s as i32, want, "sum {t}");
    }
    let zeros = Q8KActs::quantize(&ThreadPool::new(1), &vec![0.0; QK_K], 1, QK_K);
    assert!(zeros.qs.iter().all(|&q| q == 0) && zeros.d[0] == 0.0);
}

#[test]
fn matmul_kquant_uses_the_selected_kernel_and_all_threads() {
    for dtype in TYPES {
        let (w, _) = fixture(dtype);
        let x = activations(3, w.cols, 2);
        let acts = Q8KActs::quantize(&ThreadPool::new(1), &x, 3, w.cols);
        let mut want = vec![0f32; 3 * w.rows];
        matmul_kquant_q8k_with(&ThreadPool::new(1), rows_scalar, &w, &acts, &mut want);
        let mut got = vec![0f32; 3 * w.rows];
        let bytes = std::fs::read(
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/fixtures/kquant/{}.bin", dtype.name())),
        )
        .expect("fixture bytes");
        let selected = KQuantMatrix::new(dtype, w.rows, w.cols, &bytes).expect("shape");
        assert_eq!(selected.layout(), if grouped_kernel().is_some() { Layout::Grouped } else { Layout::File });
        matmul_kquant(&ThreadPool::new(2), &selected, &x, 3, &mut got);
        assert_eq!(got, want, "{}", dtype.name());
    }
}

#[test]
fn several_matrices_in_one_call_give_each_ones_own_result() {
    // Mixed types, layouts and row counts (a 3-row matrix is one short group), as the gated
    // projections of a layer are; decode (1 row) and a tile plus a remainder (5 rows).
    let cols = 2 * QK_K;
    let shapes = [
        (KQuantType::Q4K, 35, Layout::Grouped),
        (KQuantType::Q6K, 3, Layout::File),
        (KQuantType::Q5K, 48, Layout::Grouped),
    ];
    let grouped = grouped_kernel().is_some();
    let mats: Vec<KQuantMatrix> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(dtype, rows, layout))| {
            let layout = if grouped { layout } else { Layout::File };
            KQuantMatrix::with_layout(dtype, rows, cols, &random_bytes(dtype, rows, cols, i as u64 + 7), layout)
                .expect("shape")
        })
        .collect();
    for m in [1, 5] {
        let x = activations(m, cols, m);
        let acts = Q8KActs::quantize(&ThreadPool::new(1), &x, m, cols);
        let want: Vec<Vec<f32>> = mats
            .iter()
            .map(|w| {
                let mut out = vec![f32::NAN; m * w.rows];
                matmul_kquant_q8k(&ThreadPool::new(1), w, &acts, &mut out);
                out
            })
            .collect();
        for threads in [1, 2, 3] {
            let mut got: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
            let mut pairs: Vec<(&KQuantMatrix, &mut [f32])> =
                mats.iter().zip(got.iter_mut()).map(|(w, o)| (w, &mut o[..])).collect();
            matmul_kquant_q8k_many(&ThreadPool::new(threads), &acts, &mut pairs);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "m={m} threads={threads}"
                );
            }
        }
    }
}

#[test]
fn quantize_rows_round_trips_within_a_step() {
    let cols = 2 * QK_K;
    let x = activations(3, cols, 7);
    for dtype in TYPES {
        let bytes = quantize_rows(dtype, &x);
        let w = KQuantMatrix::with_layout(dtype, 3, cols, &bytes, Layout::File).expect("shape");
        let mut row = vec![0f32; cols];
        for r in 0..3 {
            w.dequantize_row(r, &mut row);
            for blk in 0..cols / QK_K {
                let at = r * cols + blk * QK_K;
                let span = x[at..at + QK_K].iter().fold(0f32, |a, &v| a.max(v.abs()));
                // one code step of the coarsest sub-block, plus the 6/8-bit scale rounding
                let tol = span * if dtype == KQuantType::Q4K { 0.15 } else { 0.08 };
                for i in 0..QK_K {
                    let (got, want) = (row[blk * QK_K + i], x[at + i]);
                    assert!(
                        (got - want).abs() <= tol,
                        "{} row {r} value {}: {got} vs {want}",
                        dtype.name(),
                        blk * QK_K + i
                    );
                }
            }
        }
    }
}

#[test]
fn shape_errors_are_reported() {
    assert_eq!(
        KQuantMatrix::new(KQuantType::Q4K, 1, 100, &[0; 144]).err(),
        Some(KQuantError::Cols { dtype: "Q4_K", cols: 100 })
    );
    assert!(matches!(KQuantMatrix::new(KQuantType::Q6K, 2, 256, &[0; 210]), Err(KQuantError::Len { want: 420, .. })));
}

/// The grouped-layout kernels this CPU has, named.
fn grouped_kernels() -> Vec<(&'static str, grouped::GroupedKernel)> {
    #[allow(unused_mut)]
    let mut v: Vec<(&'static str, grouped::GroupedKernel)> = vec![("grouped scalar", grouped::rows_scalar)];
    #[cfg(target_arch = "x86_64")]
    {
        let bw = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            v.push(("grouped avx2", grouped::x86::rows_avx2));
            if std::arch::is_x86_feature_detected!("avxvnni") {
                v.push(("grouped avx2 avx-vnni", grouped::x86::rows_avx2_vnni));
            }
        }
        if bw {
            v.push(("grouped avx512", grouped::x86::rows_avx512));
        }
        if bw && std::arch::is_x86_feature_detected!("avx512vnni") {
            v.push(("grouped avx512-vnni", grouped::x86::rows_avx512_vnni));
        }
    }
    v
}

#[test]
fn grouped_layout_keeps_every_row_byte_for_byte() {
    for dtype in TYPES {
        for rows in [1, 16, 35] {
            let cols = 2 * QK_K;
            let bytes = random_bytes(dtype, rows, cols, rows as u64);
            let file = KQuantMatrix::with_layout(dtype, rows, cols, &bytes, Layout::File).expect("shape");
            let grouped = KQuantMatrix::with_layout(dtype, rows, cols, &bytes, Layout::Grouped).expect("shape");
            let rb = file.row_bytes();
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                let back = grouped::unpack_row(dtype, cols, grouped::data(&grouped), r);
                assert_eq!(back, bytes[r * rb..(r + 1) * rb], "{} rows {rows} row {r}", dtype.name());
                file.dequantize_row(r, &mut a);
                grouped.dequantize_row(r, &mut b);
                assert_eq!(a, b, "{} row {r}", dtype.name());
            }
        }
    }
}

#[test]
fn grouped_kernels_give_the_scalar_bits_for_any_rows_and_threads() {
    let grouped_sets = grouped_kernels();
    for dtype in TYPES {
        for (rows, cols) in [(3, 2 * QK_K), (35, 3 * QK_K), (48, QK_K)] {
            let bytes = random_bytes(dtype, rows, cols, (rows + cols) as u64);
            let file = KQuantMatrix::with_layout(dtype, rows, cols, &bytes, Layout::File).expect("shape");
            let grouped = KQuantMatrix::with_layout(dtype, rows, cols, &bytes, Layout::Grouped).expect("shape");
            for m in [1, 2, 4, 5, 9, 17] {
                let x = activations(m, cols, m + rows);
                let acts = Q8KActs::quantize(&ThreadPool::new(2), &x, m, cols);
                let mut want = vec![f32::NAN; m * rows];
                matmul_kquant_q8k_with(&ThreadPool::new(1), rows_scalar, &file, &acts, &mut want);
                for &(name, kernel) in &grouped_sets {
                    for threads in [1, 2, 3] {
                        let mut got = vec![f32::NAN; m * rows];
                        grouped::matmul(&ThreadPool::new(threads), kernel, &grouped, &acts, &mut got);
                        assert_eq!(
                            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{} {rows}x{cols} {name} m={m} threads={threads}",
                            dtype.name()
                        );
                    }
                    for mi in 0..m {
                        let one = Q8KActs::quantize(&ThreadPool::new(1), &x[mi * cols..(mi + 1) * cols], 1, cols);
                        let mut got = vec![f32::NAN; rows];
                        grouped::matmul(&ThreadPool::new(2), kernel, &grouped, &one, &mut got);
                        assert_eq!(got, want[mi * rows..(mi + 1) * rows], "{} {name} row {mi}", dtype.name());
                    }
                }
            }
        }
    }
}
