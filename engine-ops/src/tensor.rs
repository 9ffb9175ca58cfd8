//! Device-neutral descriptions of stored tensors: what `format/` hands a backend to build its
//! own weight types from (`ops::Ops::matrix` and friends).
//!
//! Contract: a [`TensorDesc`] names a tensor's element type, its `[rows][cols]` shape (rows
//! are outputs, cols the contiguous inputs) and its stored bytes, which stay mapped as long as
//! any [`SharedBytes`] of the file lives, so a backend may keep reading them (the CPU reads
//! embedding rows straight from the map) instead of copying.

use std::borrow::Cow;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use crate::EngineError;

/// Element type of a stored tensor: ggml's types (GGUF files) that the engine reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    /// K-quants: super-blocks of [`QK_K`] values.
    #[allow(non_camel_case_types)] // ggml's names
    Q4_K,
    #[allow(non_camel_case_types)]
    Q5_K,
    #[allow(non_camel_case_types)]
    Q6_K,
}

/// Values per block of the 32-value quantized types (Q8_0, Q4_0, Q4_1).
pub const QK: usize = 32;
/// Values per K-quant super-block.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Maps a GGUF `ggml_type` id; `None` for types the engine does not read.
    pub fn from_ggml_id(id: u32) -> Option<GgmlType> {
        match id {
            0 => Some(GgmlType::F32),
            1 => Some(GgmlType::F16),
            2 => Some(GgmlType::Q4_0),
            3 => Some(GgmlType::Q4_1),
            8 => Some(GgmlType::Q8_0),
            12 => Some(GgmlType::Q4_K),
            13 => Some(GgmlType::Q5_K),
            14 => Some(GgmlType::Q6_K),
            30 => Some(GgmlType::BF16),
            _ => None,
        }
    }

    /// Values per block: 1 for float types, 32 for the quantized ones, 256 for K-quants.
    pub fn block_values(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => QK,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => QK_K,
        }
    }

    /// Bytes per block (ggml's block layouts).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            // f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 nibble bytes
            GgmlType::Q4_K => 144,
            // as Q4_K plus 32 bytes of fifth bits
            GgmlType::Q5_K => 176,
            // 128 low-nibble bytes, 64 high-bit bytes, 16 i8 scales, f16 d
            GgmlType::Q6_K => 210,
        }
    }

    /// Whether this is one of the K-quants (Q4_K, Q5_K, Q6_K).
    pub fn is_kquant(self) -> bool {
        matches!(self, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
    }

    /// Bytes of a row of `cols` values; `None` if `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_values()) {
            return None;
        }
        (cols / self.block_values()).checked_mul(self.block_bytes())
    }

    pub fn is_quantized(self) -> bool {
        self.block_values() > 1
    }
}

/// Bytes inside a mapped file, kept mapped while this value lives.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl SharedBytes {
    /// `owner`'s bytes in `range`; `None` when the range is outside them.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<SharedBytes> {
        let len = (*owner).as_ref().len();
        (range.start <= range.end && range.end <= len).then_some(SharedBytes { owner, range })
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({:?})", self.range)
    }
}

/// One stored tensor as a backend needs it to build a weight: see the module contract.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    /// The tensor's name in its file (for errors).
    pub name: String,
    /// The file (for errors).
    pub file: PathBuf,
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: SharedBytes,
}

impl TensorDesc {
    /// An error about this tensor, naming its file.
    pub fn error(&self, problem: impl std::fmt::Display) -> EngineError {
        EngineError::model_file(&self.file, format!("tensor {}: {problem}", self.name))
    }
}

/// A weight matrix `[rows][cols]` (out features x in features) as a file or a generator
/// describes it: a backend builds its own matrix from it ([`crate::Ops::matrix`]), so the
/// description names no device type. Bytes are borrowed from the mapped file where they can be.
#[derive(Clone, Debug)]
pub struct MatrixDesc<'a> {
    /// The tensor's name (for errors).
    pub name: String,
    /// The file that holds it (for errors); `None` for generated weights.
    pub file: Option<PathBuf>,
    pub rows: usize,
    pub cols: usize,
    pub data: MatrixData<'a>,
}

/// How a [`MatrixDesc`]'s values are stored.
#[derive(Clone, Debug)]
pub enum MatrixData<'a> {
    /// GGML-typed rows (F32, F16, BF16, block quants, K-quants), `rows * dtype.row_bytes(cols)` bytes.
    Ggml { dtype: GgmlType, bytes: Cow<'a, [u8]> },
    /// NVFP4 (ModelOpt): two E2M1 codes per byte (`[rows, cols / 2]`), one E4M3 scale per 16
    /// inputs (`[rows, cols / 16]`), a global scale; see [`crate::nvfp4`].
    Nvfp4 { packed: Cow<'a, [u8]>, scales: Cow<'a, [u8]>, global_scale: f32, input_scale: Option<f32> },
    /// Columns stored in another order: the matrix's column `i` is `inner`'s column `at[i]`
    /// (`inner` has the same shape). Used where reordering the stored bytes would split
    /// quantization blocks.
    Scattered { inner: Box<MatrixData<'a>>, at: Vec<u32> },
}

impl MatrixDesc<'_> {
    /// An error about this matrix, naming its file when it has one.
    pub fn error(&self, problem: impl std::fmt::Display) -> EngineError {
        match &self.file {
            Some(file) => EngineError::model_file(file, format!("tensor {}: {problem}", self.name)),
            None => EngineError::Internal(format!("weight {}: {problem}", self.name)),
        }
    }
}

/// IEEE half to f32, branch-light so loops over it vectorize.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    // Rebias by multiplying with 2^112: correct for normals and subnormals alike.
    let v = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let v = if em >= 0x7c00 { f32::from_bits((em << 13) | 0x7f80_0000) } else { v };
    f32::from_bits(v.to_bits() | sign)
}

/// bfloat16 to f32 (exact: bf16 is f32's upper half).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Dequantizes one row (`out.len()` values) from its bytes. A row shorter than
/// `dtype.row_bytes(out.len())`, or a length that is not a whole number of blocks, leaves the
/// uncovered tail of `out` at zero rather than panicking.
pub fn dequantize_row(dtype: GgmlType, row: &[u8], out: &mut [f32]) {
    let bv = dtype.block_values();
    let bb = dtype.block_bytes();
    let n_blocks = (out.len() / bv).min(row.len() / bb);
    out[n_blocks * bv..].fill(0.0);
    for (b, dst) in out.chunks_exact_mut(bv).take(n_blocks).enumerate() {
        let blk = &row[b * bb..(b + 1) * bb];
        match dtype {
            GgmlType::F32 => dst[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            GgmlType::F16 => dst[0] = f16_to_f32(read_u16(blk, 0)),
            GgmlType::BF16 => dst[0] = bf16_to_f32(read_u16(blk, 0)),
            GgmlType::Q8_0 => {
                let d = f16_to_f32(read_u16(blk, 0));
                for (o, &q) in dst.iter_mut().zip(&blk[2..34]) {
                    *o = d * (q as i8) as f32;
                }
            }
            GgmlType::Q4_0 => {
                let d = f16_to_f32(read_u16(blk, 0));
                for j in 0..16 {
                    let byte = blk[2 + j];
                    dst[j] = d * ((byte & 0x0f) as i32 - 8) as f32;
                    dst[j + 16] = d * ((byte >> 4) as i32 - 8) as f32;
                }
            }
            GgmlType::Q4_1 => {
                let d = f16_to_f32(read_u16(blk, 0));
                let m = f16_to_f32(read_u16(blk, 2));
                for j in 0..16 {
                    let byte = blk[4 + j];
                    dst[j] = d * (byte & 0x0f) as f32 + m;
                    dst[j + 16] = d * (byte >> 4) as f32 + m;
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                if let Some(k) = crate::kquant::KQuantType::of(dtype) {
                    crate::kquant::dequantize_row(k, blk, dst);
                }
            }
        }
    }
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
