//! K-quant kernels against llama.cpp's gguf-py (`tests/fixtures/kquant`, made by
//! scripts/reference/make_kquant_reference.py) and against their own float kernels.

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
    (KQuantMatrix::new(dtype, rows, cols, &bytes).expect("fixture shape"), values)
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
        // The SIMD-compiled panel dequantization gives the same values.
        let mut panel = vec![0f32; w.rows * w.cols];
        dequantize_panel(&w, 0, w.rows, &mut panel);
        for r in 0..w.rows {
            w.dequantize_row(r, &mut row);
            assert_eq!(&panel[r * w.cols..(r + 1) * w.cols], &row[..], "{} panel row {r}", dtype.name());
        }
    }
}

#[test]
fn matmul_equals_the_float_kernels_on_the_dequantized_matrix_for_any_rows_and_threads() {
    for dtype in TYPES {
        let (w, deq) = fixture(dtype);
        let f = FloatMatrix { rows: w.rows, cols: w.cols, data: deq };
        for m in [1, 2, 5] {
            let x: Vec<f32> = (0..m * w.cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 41.0).collect();
            let mut want = vec![0f32; m * w.rows];
            matmul_float(&ThreadPool::new(1), &f, &x, m, &mut want);
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; m * w.rows];
                matmul_kquant(&ThreadPool::new(threads), &w, &x, m, &mut got);
                assert_eq!(got, want, "{} m={m} threads={threads}", dtype.name());
                // One row at a time (the fused decode kernels where the CPU has them).
                for mi in 0..m {
                    let mut one = vec![f32::NAN; w.rows];
                    matmul_kquant(&ThreadPool::new(threads), &w, &x[mi * w.cols..], 1, &mut one);
                    assert_eq!(
                        one,
                        want[mi * w.rows..(mi + 1) * w.rows],
                        "{} row {mi} threads={threads}",
                        dtype.name()
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
