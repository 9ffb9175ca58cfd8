//! Where Qwen3.6 weights come from.
//!
//! Contract: a [`WeightSource`] hands out matrices as device-neutral [`MatrixDesc`]s (the
//! checkpoint's dtype and bytes: float weights stay F32/F16/BF16, NVFP4 Linears stay packed)
//! and small f32 vectors, by the canonical names of the architecture (docs/qwen36.md);
//! [`SafetensorsWeights`] resolves them in an HF checkpoint, [`RandomWeights`] generates seeded
//! values (speed measurements, no file). [`load_matrix`] and [`load_norm_1p`] build a device's
//! weights from them through the op seam.

use std::borrow::Cow;

use crate::EngineError;
use crate::format::kquant::{KQuantType, QK_K, quantize_rows};
use crate::format::safetensors::{SafeTensors, StDtype};
use crate::format::{GgmlType, MatrixData, MatrixDesc, nvfp4};

use engine_ops::Ops;

/// The matrix `name` of `src` (`[rows, cols]`), in the device's layout.
pub fn load_matrix<O: Ops>(
    ops: &O,
    src: &dyn WeightSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<O::Matrix, EngineError> {
    ops.matrix(&src.matrix(name, rows, cols)?)
}

/// A zero-centred RMSNorm weight `name` (`len` values) as the plain norm's weight `1 + w`
/// (f32, so `x̂ · (1 + w)` keeps its bits).
pub fn load_norm_1p<O: Ops>(ops: &O, src: &dyn WeightSource, name: &str, len: usize) -> Result<O::Vector, EngineError> {
    let w: Vec<f32> = src.vector(name, &[len])?.iter().map(|&v| 1.0 + v).collect();
    Ok(ops.vector_from(&w))
}

/// Hands out weights by canonical name: `embed_tokens.weight`, `norm.weight`,
/// `layers.{i}.…` (the decoder; resolved under the checkpoint's prefix), `lm_head.weight`
/// and `mtp.…` (no prefix).
pub trait WeightSource {
    /// A `[rows, cols]` matrix, as stored (bytes borrowed where the source maps a file).
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<MatrixDesc<'_>, EngineError>;
    /// A float tensor of exactly `shape`, as f32.
    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError>;
    fn has(&self, name: &str) -> bool;
}

/// Weights of an HF safetensors checkpoint (`model.language_model.*` or `model.*`).
pub struct SafetensorsWeights<'a> {
    st: &'a SafeTensors,
    prefix: &'static str,
}

impl<'a> SafetensorsWeights<'a> {
    pub fn new(st: &'a SafeTensors) -> Result<SafetensorsWeights<'a>, EngineError> {
        let prefix = ["model.language_model.", "model."]
            .into_iter()
            .find(|p| st.has(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| {
                st.error("tensor model.language_model.embed_tokens.weight (or model.embed_tokens.weight): not found")
            })?;
        Ok(SafetensorsWeights { st, prefix })
    }

    fn resolve(&self, name: &str) -> String {
        if name.starts_with("lm_head.") || name.starts_with("mtp.") {
            name.to_string()
        } else {
            format!("{}{name}", self.prefix)
        }
    }
}

fn ggml_dtype(d: StDtype) -> Option<GgmlType> {
    match d {
        StDtype::F32 => Some(GgmlType::F32),
        StDtype::F16 => Some(GgmlType::F16),
        StDtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

impl WeightSource for SafetensorsWeights<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<MatrixDesc<'_>, EngineError> {
        let full = self.resolve(name);
        let desc = |data| MatrixDesc { name: full.clone(), file: Some(self.st.tensor_path(&full)), rows, cols, data };
        // NVFP4 iff `weight` is U8 and `weight_scale` exists (spec 8.2).
        let base = full.strip_suffix(".weight").unwrap_or(&full);
        let scale_name = format!("{base}.weight_scale");
        if self.st.info(&full).is_some_and(|i| i.dtype == StDtype::U8) && self.st.has(&scale_name) {
            let packed = self.st.tensor_with_shape(&full, &[rows, cols / 2])?;
            let scales = self.st.tensor_with_shape(&scale_name, &[rows, cols / 16])?;
            if scales.dtype != StDtype::F8E4M3 {
                return Err(self.st.tensor_error(&scale_name, format!("dtype {:?}, expected F8_E4M3", scales.dtype)));
            }
            let scalar = |n: &str| -> Result<Option<f32>, EngineError> {
                if !self.st.has(n) {
                    return Ok(None);
                }
                let t = self.st.tensor(n)?;
                match (t.dtype, t.to_f32()) {
                    (StDtype::F32 | StDtype::BF16 | StDtype::F16, Some(v)) if v.len() == 1 => Ok(Some(v[0])),
                    _ => Err(self.st.tensor_error(n, "expected one float scalar")),
                }
            };
            let s2_name = format!("{base}.weight_scale_2");
            let global_scale = scalar(&s2_name)?.ok_or_else(|| self.st.tensor_error(&s2_name, "not found"))?;
            let input_scale = scalar(&format!("{base}.input_scale"))?;
            return Ok(desc(MatrixData::Nvfp4 {
                packed: Cow::Borrowed(packed.data),
                scales: Cow::Borrowed(scales.data),
                global_scale,
                input_scale,
            }));
        }
        let t = self.st.tensor_with_shape(&full, &[rows, cols])?;
        let dtype = ggml_dtype(t.dtype).ok_or_else(|| {
            self.st
                .tensor_error(&full, format!("dtype {:?} is not supported for a weight matrix (F32/F16/BF16)", t.dtype))
        })?;
        Ok(desc(MatrixData::Ggml { dtype, bytes: Cow::Borrowed(t.data) }))
    }

    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        let full = self.resolve(name);
        let t = self.st.tensor_with_shape(&full, shape)?;
        t.to_f32().ok_or_else(|| self.st.tensor_error(&full, format!("dtype {:?} is not a float type", t.dtype)))
    }

    fn has(&self, name: &str) -> bool {
        self.st.has(&self.resolve(name))
    }
}

/// Seeded random weights: every tensor's values depend only on the seed and its name, so
/// loading order does not matter. Matrices are uniform with variance `1/cols` (activations
/// keep their scale through the layers); norm weights are near their identity; `A_log` and
/// `dt_bias` give decays spread over (0, 1).
pub struct RandomWeights {
    pub seed: u64,
    /// Storage type of matrices (BF16 for real sizes, F32 for exactness tests). A K-quant
    /// type stands for llama.cpp's `_M` mix: that type for the decoder's Linears, Q6_K for the
    /// embedding and head (llama.cpp's output type), BF16 where a matrix is not whole
    /// super-blocks wide and for the small `in_proj_a/b` and `mtp.*` matrices.
    pub dtype: GgmlType,
    /// Quantize the decoder's Linears to NVFP4 (as ModelOpt exports do: not the embedding,
    /// head, `in_proj_a/b` or `mtp.*`).
    pub nvfp4: bool,
    /// Whether the checkpoint would have an MTP module.
    pub with_mtp: bool,
    /// Whether `lm_head.weight` exists (untied head).
    pub with_lm_head: bool,
}

/// SplitMix64: fast, seedable, good enough for weight noise.
struct Rng(u64);

impl Rng {
    fn for_tensor(seed: u64, name: &str) -> Rng {
        Rng(seed ^ xxhash_rust::xxh3::xxh3_64(name.as_bytes()))
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

impl WeightSource for RandomWeights {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<MatrixDesc<'_>, EngineError> {
        let desc = |data| MatrixDesc { name: name.to_string(), file: None, rows, cols, data };
        let mut rng = Rng::for_tensor(self.seed, name);
        let a = (3.0 / cols as f32).sqrt();
        let n = rows.checked_mul(cols).ok_or_else(|| EngineError::Internal(format!("{name}: size overflows")))?;
        let keep_float =
            ["embed_tokens.", "lm_head.", "mtp.", "in_proj_a.", "in_proj_b."].iter().any(|k| name.contains(k));
        if self.nvfp4 && !keep_float {
            let w: Vec<f32> = (0..n).map(|_| a * rng.uniform()).collect();
            if !cols.is_multiple_of(nvfp4::BLOCK) {
                return Err(EngineError::InvalidRequest(format!(
                    "{name}: {cols} columns are not whole NVFP4 blocks of {}",
                    nvfp4::BLOCK
                )));
            }
            let q = nvfp4::quantize(rows, cols, &w);
            return Ok(desc(MatrixData::Nvfp4 {
                packed: Cow::Owned(q.packed),
                scales: Cow::Owned(q.scales),
                global_scale: q.global_scale,
                input_scale: None,
            }));
        }
        if KQuantType::of(self.dtype).is_some()
            && cols.is_multiple_of(QK_K)
            && !["mtp.", "in_proj_a.", "in_proj_b."].iter().any(|k| name.contains(k))
        {
            let dtype = if ["embed_tokens.", "lm_head."].iter().any(|k| name.contains(k)) {
                GgmlType::Q6_K
            } else {
                self.dtype
            };
            let kind = KQuantType::of(dtype).ok_or_else(|| EngineError::Internal(format!("{dtype:?}")))?;
            let w: Vec<f32> = (0..n).map(|_| a * rng.uniform()).collect();
            return Ok(desc(MatrixData::Ggml { dtype, bytes: Cow::Owned(quantize_rows(kind, &w)) }));
        }
        let dtype = if KQuantType::of(self.dtype).is_some() { GgmlType::BF16 } else { self.dtype };
        let bytes: Vec<u8> = match dtype {
            GgmlType::F32 => (0..n).flat_map(|_| (a * rng.uniform()).to_le_bytes()).collect(),
            GgmlType::BF16 => {
                (0..n).flat_map(|_| half::bf16::from_f32(a * rng.uniform()).to_bits().to_le_bytes()).collect()
            }
            GgmlType::F16 => {
                (0..n).flat_map(|_| half::f16::from_f32(a * rng.uniform()).to_bits().to_le_bytes()).collect()
            }
            other => return Err(EngineError::InvalidRequest(format!("random weights in {other:?} are not supported"))),
        };
        Ok(desc(MatrixData::Ggml { dtype, bytes: Cow::Owned(bytes) }))
    }

    fn vector(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EngineError> {
        let mut rng = Rng::for_tensor(self.seed, name);
        let n: usize = shape.iter().product();
        let v = if name.ends_with("A_log") {
            // exp(A_log) in [1, 16].
            (0..n).map(|_| (8.5 + 7.5 * rng.uniform()).ln()).collect()
        } else if name.ends_with("dt_bias") {
            (0..n).map(|_| rng.uniform()).collect()
        } else if name.ends_with("linear_attn.norm.weight") {
            (0..n).map(|_| 1.0 + 0.1 * rng.uniform()).collect()
        } else if name.ends_with("conv1d.weight") {
            (0..n).map(|_| 0.5 * rng.uniform()).collect()
        } else {
            // Zero-centred norms: (1 + w) near 1.
            (0..n).map(|_| 0.1 * rng.uniform()).collect()
        };
        Ok(v)
    }

    fn has(&self, name: &str) -> bool {
        // No FP8 KV scales: random checkpoints use 1.0.
        if name.ends_with("k_scale") || name.ends_with("v_scale") {
            return false;
        }
        if name.starts_with("mtp.") {
            return self.with_mtp;
        }
        if name == "lm_head.weight" {
            return self.with_lm_head;
        }
        true
    }
}
