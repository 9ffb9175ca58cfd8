//! Where Qwen3.6 weights come from, and how a weight matrix multiplies.
//!
//! Contract: [`Weight`] is one Linear's matrix `[out][in]`; [`Weight::matmul`] computes
//! `out[m][o] = sum_i x[m][i] * W[o][i]` in f32. Float weights (F32/F16/BF16) stay in their
//! checkpoint dtype (BF16 is not widened, so real-size models fit; [`crate::backend::cpu::kernels::floatmm`] widens
//! in registers); NVFP4 Linears stay packed and run through the FP4 kernel. A [`WeightSource`] hands out matrices and small f32 vectors by the canonical
//! names of the architecture spec (section 2); [`SafetensorsWeights`] resolves them in an HF
//! checkpoint, [`RandomWeights`] generates seeded values (speed measurements, no file).

use crate::backend::cpu::kernels::fp4::{Nvfp4Matrix, matmul_nvfp4};
use crate::backend::cpu::kernels::kquant::{KQuantMatrix, KQuantType, QK_K, matmul_kquant, quantize_rows};
use crate::backend::cpu::kernels::{GgmlType, PackedMatrix, QMatrix, ThreadPool, matmul_packed};
use crate::format::safetensors::{SafeTensors, StDtype};

use crate::EngineError;
use crate::backend::cpu::kernels::floatmm::{Bf16, Elem, FloatMatrix, matmul_float};

/// One Linear's weight matrix.
pub enum Weight {
    /// BF16 rows, row-major `[out][in]`, widened in registers ([`matmul_float`]).
    Bf16(FloatMatrix<Bf16>),
    /// F32 rows, row-major `[out][in]`.
    F32(FloatMatrix<f32>),
    /// F16 rows through the engine's generic float path.
    Dense(PackedMatrix),
    /// NVFP4 (ModelOpt): E2M1 codes, E4M3 block scales per 16 inputs, an FP32 global scale;
    /// multiplied without expansion by the FP4 kernel (weight-only: activations stay f32).
    Nvfp4(Nvfp4Matrix),
    /// GGML K-quants (Q4_K, Q5_K, Q6_K) as the GGUF file stores them, multiplied against
    /// 8-bit activations ([`matmul_kquant`]).
    KQuant(KQuantMatrix),
    /// A matrix whose columns the file stores in another order: the model's column `i` is
    /// `inner`'s column `at[i]`. The input rows are scattered into that order before the
    /// matmul (a copy of the activations instead of a reordered copy of the weights, which
    /// for K-quants would split their 256-value blocks).
    Scattered { inner: Box<Weight>, at: Vec<u32> },
}

impl Weight {
    pub fn rows(&self) -> usize {
        match self {
            Weight::Bf16(w) => w.rows,
            Weight::F32(w) => w.rows,
            Weight::Dense(p) => p.rows,
            Weight::Nvfp4(w) => w.rows(),
            Weight::KQuant(w) => w.rows,
            Weight::Scattered { inner, .. } => inner.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Weight::Bf16(w) => w.cols,
            Weight::F32(w) => w.cols,
            Weight::Dense(p) => p.cols,
            Weight::Nvfp4(w) => w.cols(),
            Weight::KQuant(w) => w.cols,
            Weight::Scattered { inner, .. } => inner.cols(),
        }
    }

    /// `out[m * rows + o] = sum_i x[m * cols + i] * W[o][i]` for `m < m_rows`; all pool threads.
    pub fn matmul(&self, pool: &ThreadPool, x: &[f32], m_rows: usize, out: &mut [f32]) {
        match self {
            Weight::Bf16(w) => matmul_float(pool, w, x, m_rows, out),
            Weight::F32(w) => matmul_float(pool, w, x, m_rows, out),
            Weight::Dense(p) => matmul_packed(pool, p, x, m_rows, out),
            Weight::Nvfp4(w) => matmul_nvfp4(pool, w, x, m_rows, out),
            Weight::KQuant(w) => matmul_kquant(pool, w, x, m_rows, out),
            Weight::Scattered { inner, at } => {
                let cols = inner.cols();
                let mut scattered = vec![0f32; m_rows * cols];
                for (dst, src) in scattered.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
                    for (&v, &to) in src.iter().zip(at) {
                        dst[to as usize] = v;
                    }
                }
                inner.matmul(pool, &scattered, m_rows, out)
            }
        }
    }

    /// Row `r` as f32 (embedding lookup). `out.len()` must be `cols`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<(), EngineError> {
        if r >= self.rows() || out.len() != self.cols() {
            return Err(EngineError::Internal(format!("row {r} of a {}x{} matrix", self.rows(), self.cols())));
        }
        match self {
            Weight::Bf16(w) => {
                for (o, v) in out.iter_mut().zip(w.row(r)) {
                    *o = v.widen();
                }
            }
            Weight::F32(w) => out.copy_from_slice(w.row(r)),
            Weight::Dense(p) => {
                // Bounds were checked above, so this cannot fail.
                p.row_f32(r, out);
            }
            Weight::Nvfp4(w) => w.dequantize_row(r, out),
            Weight::KQuant(w) => w.dequantize_row(r, out),
            Weight::Scattered { inner, at } => {
                let mut stored = vec![0f32; out.len()];
                inner.row_f32(r, &mut stored)?;
                for (o, &from) in out.iter_mut().zip(at) {
                    *o = stored[from as usize];
                }
            }
        }
        Ok(())
    }

    /// Bytes the matrix occupies in memory.
    pub fn bytes(&self) -> usize {
        match self {
            Weight::Bf16(w) => w.data.len() * 2,
            Weight::F32(w) => w.data.len() * 4,
            Weight::Dense(p) => p.bytes().len(),
            Weight::Nvfp4(w) => w.weight_bytes(),
            Weight::KQuant(w) => w.weight_bytes(),
            Weight::Scattered { inner, at } => inner.bytes() + at.len() * 4,
        }
    }
}

/// Hands out weights by canonical name: `embed_tokens.weight`, `norm.weight`,
/// `layers.{i}.…` (the decoder; resolved under the checkpoint's prefix), `lm_head.weight`
/// and `mtp.…` (no prefix).
pub trait WeightSource {
    /// A `[rows, cols]` matrix.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, EngineError>;
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
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        let full = self.resolve(name);
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
            let global = scalar(&s2_name)?.ok_or_else(|| self.st.tensor_error(&s2_name, "not found"))?;
            let input_scale = scalar(&format!("{base}.input_scale"))?;
            let w = Nvfp4Matrix::new(rows, cols, packed.data, scales.data, global, input_scale)
                .map_err(|e| self.st.tensor_error(&full, e.to_string()))?;
            return Ok(Weight::Nvfp4(w));
        }
        let t = self.st.tensor_with_shape(&full, &[rows, cols])?;
        let u16s = || t.data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        match t.dtype {
            StDtype::BF16 => return Ok(Weight::Bf16(FloatMatrix { rows, cols, data: u16s().map(Bf16).collect() })),
            StDtype::F32 => {
                let data = t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                return Ok(Weight::F32(FloatMatrix { rows, cols, data }));
            }
            _ => {}
        }
        let dtype = ggml_dtype(t.dtype).ok_or_else(|| {
            self.st
                .tensor_error(&full, format!("dtype {:?} is not supported for a weight matrix (F32/F16/BF16)", t.dtype))
        })?;
        let q = QMatrix { dtype, rows, cols, data: t.data };
        let p = PackedMatrix::pack(&q).ok_or_else(|| self.st.tensor_error(&full, "bytes do not match shape"))?;
        Ok(Weight::Dense(p))
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
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        let mut rng = Rng::for_tensor(self.seed, name);
        let a = (3.0 / cols as f32).sqrt();
        let n = rows.checked_mul(cols).ok_or_else(|| EngineError::Internal(format!("{name}: size overflows")))?;
        let keep_float =
            ["embed_tokens.", "lm_head.", "mtp.", "in_proj_a.", "in_proj_b."].iter().any(|k| name.contains(k));
        if self.nvfp4 && !keep_float {
            let w: Vec<f32> = (0..n).map(|_| a * rng.uniform()).collect();
            let q = Nvfp4Matrix::quantize(rows, cols, &w)
                .map_err(|e| EngineError::InvalidRequest(format!("{name}: {e}")))?;
            return Ok(Weight::Nvfp4(q));
        }
        if let Some(kind) = KQuantType::of(self.dtype)
            && cols.is_multiple_of(QK_K)
            && !["mtp.", "in_proj_a.", "in_proj_b."].iter().any(|k| name.contains(k))
        {
            let kind =
                if ["embed_tokens.", "lm_head."].iter().any(|k| name.contains(k)) { KQuantType::Q6K } else { kind };
            let w: Vec<f32> = (0..n).map(|_| a * rng.uniform()).collect();
            let q = KQuantMatrix::new(kind, rows, cols, &quantize_rows(kind, &w))
                .map_err(|e| EngineError::Internal(format!("{name}: {e}")))?;
            return Ok(Weight::KQuant(q));
        }
        let dtype = if KQuantType::of(self.dtype).is_some() { GgmlType::BF16 } else { self.dtype };
        let bytes: Vec<u8> = match dtype {
            GgmlType::F32 => {
                let data = (0..n).map(|_| a * rng.uniform()).collect();
                return Ok(Weight::F32(FloatMatrix { rows, cols, data }));
            }
            GgmlType::BF16 => {
                let data = (0..n).map(|_| Bf16(half::bf16::from_f32(a * rng.uniform()).to_bits())).collect();
                return Ok(Weight::Bf16(FloatMatrix { rows, cols, data }));
            }
            GgmlType::F16 => {
                (0..n).flat_map(|_| half::f16::from_f32(a * rng.uniform()).to_bits().to_le_bytes()).collect()
            }
            other => return Err(EngineError::InvalidRequest(format!("random weights in {other:?} are not supported"))),
        };
        let q = QMatrix { dtype, rows, cols, data: &bytes };
        let p = PackedMatrix::pack(&q).ok_or_else(|| EngineError::Internal(format!("{name}: pack failed")))?;
        Ok(Weight::Dense(p))
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
