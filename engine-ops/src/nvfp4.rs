//! NVFP4 (ModelOpt) weights as every backend reads them: two E2M1 codes per byte, one E4M3
//! scale per 16 inputs, a per-tensor global scale. The checkpoint loader (which tensors, which
//! modules) is `engine-models`' `format::nvfp4`.

use crate::fp8::{E4M3_MAX, E4M3_TO_F32, f32_to_e4m3};

/// Inputs per block scale.
pub const BLOCK: usize = 16;

/// One NVFP4 Linear as the checkpoint holds it, every dtype, shape and scale checked:
/// `rows` = out features, `cols` = in features; `packed` holds two E2M1 codes per byte
/// (`[rows, cols / 2]`), `scales` one E4M3 scale per [`BLOCK`] inputs (`[rows, cols / BLOCK]`).
#[derive(Clone, Copy, Debug)]
pub struct Nvfp4Linear<'a> {
    pub rows: usize,
    pub cols: usize,
    pub packed: &'a [u8],
    pub scales: &'a [u8],
    /// `weight_scale_2`: finite and >= 0.
    pub global_scale: f32,
    pub input_scale: Option<f32>,
}

/// E2M1 code -> value; codes 8..16 are the negatives of 0..8 (code 8 is -0).
pub const E2M1_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Nearest E2M1 code of `v` (ties to the even code, |v| > 5 saturates to 6), ModelOpt's
/// `_cast_fp4` thresholds {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}.
pub fn e2m1_code(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 8 } else { 0 };
    let a = v.abs();
    let mag = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | mag
}

/// An NVFP4 matrix's stored tensors, as ModelOpt writes them.
pub struct Nvfp4Parts {
    /// `[rows, cols/2]` E2M1 code bytes (low nibble first).
    pub packed: Vec<u8>,
    /// `[rows, cols/16]` E4M3 block scales.
    pub scales: Vec<u8>,
    /// `weight_scale_2`.
    pub global_scale: f32,
}

/// Quantizes row-major f32 weights `[rows, cols]` (`cols` a multiple of [`BLOCK`]) the way
/// ModelOpt does (spec 8.2): global = amax / (6 * 448) (1.0 for an all-zero matrix), block
/// scale = E4M3(max(block amax / (6 * global), 2^-9)) (1.0 for an all-zero block), codes =
/// nearest E2M1 of w / (scale * global), ties to the even code, saturating at 6. For tests,
/// benchmarks and random-weight models.
pub fn quantize(rows: usize, cols: usize, w: &[f32]) -> Nvfp4Parts {
    assert!(cols.is_multiple_of(BLOCK), "quantize: {cols} columns are not whole blocks of {BLOCK}");
    assert_eq!(w.len(), rows * cols, "quantize: weights are not [{rows}, {cols}]");
    let amax = w.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let global = if amax > 0.0 { amax / (6.0 * E4M3_MAX) } else { 1.0 };
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * cols / BLOCK];
    for (bi, blk) in w.chunks_exact(BLOCK).enumerate() {
        let bmax = blk.iter().fold(0f32, |a, &v| a.max(v.abs()));
        // clamped to the smallest subnormal so a tiny non-zero block keeps a non-zero scale
        let sbyte = if bmax > 0.0 { f32_to_e4m3((bmax / (6.0 * global)).max(1.0 / 512.0)) } else { 0x38 };
        scales[bi] = sbyte;
        let denom = E4M3_TO_F32[sbyte as usize] * global;
        for (j, &v) in blk.iter().enumerate() {
            let code = if denom > 0.0 { e2m1_code(v / denom) } else { 0 };
            packed[bi * 8 + j / 2] |= code << (4 * (j % 2));
        }
    }
    Nvfp4Parts { packed, scales, global_scale: global }
}
