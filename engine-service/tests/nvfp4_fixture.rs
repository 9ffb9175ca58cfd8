//! The NVFP4 loader and kernel against QWEN-GOLDEN's ModelOpt-style export
//! (`tests/fixtures/qwen36/tiny-vlm-nvfp4/`, written by `scripts/qwen36/quantize_nvfp4.py`):
//! every quantized Linear loads, the config's exclude list agrees with the tensors, and on the
//! two Linears of `kernel_goldens.safetensors` the dequantized weights equal the script's bit for
//! bit and the FP4 matmul on every ISA matches its float64 `x · W_deqᵀ` within the f32
//! summation bound of `kernels/fp4_tests.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine_cpu::kernels::ThreadPool;
use engine_cpu::kernels::fp4::{Fp4Isa, Nvfp4Matrix, matmul_nvfp4_with};
use engine_models::format::nvfp4::{
    Nvfp4Linear, QuantConfig, RawTensor, TensorDtype, kv_scale, load_linear, load_linear_st,
};
use engine_models::format::safetensors::SafeTensors;

/// The CPU backend's matrix of a checked checkpoint Linear.
fn matrix(l: Nvfp4Linear) -> Nvfp4Matrix {
    Nvfp4Matrix::from_linear(&l).expect("a checked Linear builds a matrix")
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36/tiny-vlm-nvfp4")
}

/// A whole safetensors file read into memory: name -> (dtype, shape, byte range).
struct File {
    bytes: Vec<u8>,
    tensors: HashMap<String, (TensorDtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl File {
    fn read(path: &Path) -> File {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8-byte length")) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("JSON header");
        let mut tensors = HashMap::new();
        for (name, v) in header.as_object().expect("header object") {
            if name == "__metadata__" {
                continue;
            }
            let dtype = TensorDtype::from_safetensors(v["dtype"].as_str().expect("dtype"));
            let shape =
                v["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
            let off = v["data_offsets"].as_array().expect("offsets");
            let (a, b) = (off[0].as_u64().expect("start") as usize, off[1].as_u64().expect("end") as usize);
            tensors.insert(name.clone(), (dtype, shape, 8 + n + a..8 + n + b));
        }
        File { bytes, tensors }
    }

    fn get(&self, name: &str) -> Option<RawTensor<'_>> {
        self.tensors.get(name).map(|(dtype, shape, r)| RawTensor { dtype: *dtype, shape, data: &self.bytes[r.clone()] })
    }

    fn f32s(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let t = self.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.dtype, TensorDtype::F32, "{name}");
        (t.shape.to_vec(), t.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }
}

#[test]
fn every_quantized_linear_loads_and_the_exclude_list_agrees_with_the_tensors() {
    let dir = fixture_dir();
    let cfg = QuantConfig::from_dir(&dir).expect("readable").expect("quantized checkpoint");
    assert!(cfg.kv_cache_fp8);
    let file = File::read(&dir.join("model.safetensors"));
    let mut quantized = 0;
    for (name, (dtype, shape, _)) in &file.tensors {
        let Some(module) = name.strip_suffix(".weight") else { continue };
        let loaded = load_linear(module, None, |n| file.get(n)).unwrap_or_else(|e| panic!("{e}")).map(matrix);
        match loaded {
            Some(w) => {
                quantized += 1;
                assert!(cfg.is_quantized(module), "{module} is NVFP4 but excluded by the config");
                assert_eq!((w.rows(), w.cols()), (shape[0], shape[1] * 2), "{module}");
                assert!(w.global_scale() > 0.0 && w.input_scale().is_some_and(|s| s > 0.0), "{module}");
            }
            None if shape.len() == 2 && !module.ends_with("embed_tokens") => {
                assert!(matches!(dtype, TensorDtype::BF16), "{module} kept as {dtype:?}");
                assert!(cfg.is_excluded(module), "{module} is BF16 but the config does not exclude it");
            }
            None => {}
        }
    }
    assert_eq!(quantized, 25, "the README lists 25 quantized Linears");
    let l3 = "model.language_model.layers.3.self_attn";
    let k = kv_scale(&[&format!("{l3}.k_proj.k_scale"), &format!("{l3}.k_scale")], |n| file.get(n)).expect("valid");
    let v = kv_scale(&[&format!("{l3}.v_proj.v_scale"), &format!("{l3}.v_scale")], |n| file.get(n)).expect("valid");
    assert_eq!((k, v), (1.0, 1.0));
}

#[test]
fn dequantized_weights_and_fp4_matmul_match_the_script_reference() {
    let dir = fixture_dir();
    let model = File::read(&dir.join("model.safetensors"));
    let gold = File::read(&dir.join("kernel_goldens.safetensors"));
    for lin in ["model.language_model.layers.0.mlp.down_proj", "model.language_model.layers.3.self_attn.q_proj"] {
        let w = matrix(load_linear(lin, None, |n| model.get(n)).expect("valid").expect("NVFP4"));
        let (dshape, deq) = gold.f32s(&format!("{lin}.weight_dequant"));
        assert_eq!(dshape, [w.rows(), w.cols()]);
        let mine = w.dequantize();
        for (i, (a, b)) in mine.iter().zip(&deq).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{lin} weight {i}: {a} vs {b}");
        }
        let (xshape, x) = gold.f32s(&format!("{lin}.x"));
        let (_, y_ref) = gold.f32s(&format!("{lin}.y_w4a16"));
        let m = xshape[0];
        for isa in Fp4Isa::available() {
            let pool = ThreadPool::new(2);
            let mut y = vec![0f32; m * w.rows()];
            matmul_nvfp4_with(isa, &pool, &w, &x, m, &mut y);
            for r in 0..m {
                for o in 0..w.rows() {
                    let abs: f64 =
                        (0..w.cols()).map(|i| (deq[o * w.cols() + i] as f64 * x[r * w.cols() + i] as f64).abs()).sum();
                    // f32 summation bound (see fp4_tests.rs) plus the rounding of the f32 reference itself
                    let tol = (w.cols() as f64 / 8.0 + 8.0) * f32::EPSILON as f64 * abs
                        + f32::EPSILON as f64 * y_ref[r * w.rows() + o].abs() as f64;
                    let (got, want) = (y[r * w.rows() + o], y_ref[r * w.rows() + o]);
                    assert!(
                        ((got - want) as f64).abs() <= tol,
                        "{} {lin} y[{r},{o}] = {got}, reference {want} (tol {tol:e})",
                        isa.name()
                    );
                }
            }
        }
    }
}

#[test]
fn the_safetensors_entry_point_loads_the_same_matrices_and_names_file_and_tensor_in_errors() {
    let dir = fixture_dir();
    let st = SafeTensors::open(&dir).expect("checkpoint opens");
    let file = File::read(&dir.join("model.safetensors"));
    let lin = "model.language_model.layers.0.linear_attn.in_proj_qkv";
    let a = matrix(load_linear_st(&st, lin, Some([128, 64])).expect("valid").expect("NVFP4"));
    let b = matrix(load_linear(lin, None, |n| file.get(n)).expect("valid").expect("NVFP4"));
    assert_eq!((a.packed(), a.scales(), a.global_scale()), (b.packed(), b.scales(), b.global_scale()));
    assert!(load_linear_st(&st, "model.language_model.layers.0.linear_attn.in_proj_a", None).expect("valid").is_none());
    let err = load_linear_st(&st, lin, Some([64, 64])).expect_err("wrong expected shape").to_string();
    assert!(err.contains("model.safetensors") && err.contains(&format!("tensor {lin}.weight: shape")), "{err}");
}
