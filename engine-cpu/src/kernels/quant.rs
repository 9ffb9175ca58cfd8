//! GGUF/ggml tensor element types, row dequantization, and the Q8 activation format the
//! integer matmul kernels consume.
//!
//! Block formats (little-endian): Q4_0 = f16 d + 16 nibble bytes, value d*(q-8); Q4_1 = f16 d,
//! f16 m + 16 nibble bytes, value d*q + m; Q8_0 = f16 d + 32 i8, value d*q. Within a 4-bit
//! block byte j's low nibble is value j and its high nibble value j+16.
//!
//! Activations are quantized once per matmul into [`Q8Acts`]: blocks of 32 i8 with an f32
//! scale `d` and `s = d * sum(q)` (the sum lets offset/min weight terms cost one FMA per block).

pub use engine_ops::tensor::{GgmlType, QK, bf16_to_f32, dequantize_row, f16_to_f32};

/// f32 to IEEE half, round-to-nearest-even.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[inline(always)]
pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Activation rows quantized to Q8 blocks of 32: `qs[m * cols + k]`, and per block
/// (`m * blocks + b`) the scale `d` and `s = d * sum(q)`.
#[derive(Clone, Debug, Default)]
pub struct Q8Acts {
    pub m_rows: usize,
    pub cols: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

impl Q8Acts {
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Quantizes `m_rows` rows of `cols` values (`cols` a multiple of 32), reusing buffers.
    pub fn quantize_into(&mut self, x: &[f32], m_rows: usize, cols: usize) {
        debug_assert!(cols.is_multiple_of(QK));
        let nb = cols / QK;
        self.m_rows = m_rows;
        self.cols = cols;
        self.qs.resize(m_rows * cols, 0);
        self.d.resize(m_rows * nb, 0.0);
        self.s.resize(m_rows * nb, 0.0);
        let f = crate::kernels::dispatch().quantize_q8;
        for i in 0..m_rows * nb {
            let (d, s) = f(&x[i * QK..(i + 1) * QK], &mut self.qs[i * QK..(i + 1) * QK]);
            self.d[i] = d;
            self.s[i] = s;
        }
    }

    pub fn quantize(x: &[f32], m_rows: usize, cols: usize) -> Q8Acts {
        let mut a = Q8Acts::default();
        a.quantize_into(x, m_rows, cols);
        a
    }
}

/// Quantizes one block of 32 values; returns `(d, d * sum(q))`. Reference implementation.
pub(crate) fn quantize_block_q8_scalar(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        // round-half-away like ggml; the clamp only matters for NaN/inf input
        let r = (v * id).round().clamp(-127.0, 127.0) as i8;
        *o = r;
        sum += r as i32;
    }
    (d, d * sum as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_bytes_rejects_partial_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q8_0.row_bytes(33), None);
        assert_eq!(GgmlType::F16.row_bytes(7), Some(14));
        assert_eq!(GgmlType::from_ggml_id(30), Some(GgmlType::BF16));
        assert_eq!(GgmlType::from_ggml_id(12), Some(GgmlType::Q4_K));
        assert_eq!(GgmlType::Q6_K.row_bytes(512), Some(2 * 210));
        assert_eq!(GgmlType::Q4_K.row_bytes(64), None);
        assert_eq!(GgmlType::from_ggml_id(11), None);
    }

    #[test]
    fn f16_conversion_matches_half_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            assert!(got.to_bits() == want.to_bits() || (want.is_nan() && got.is_nan()), "{h:#x}");
        }
    }

    #[test]
    fn dequantize_q4_1_uses_low_then_high_nibbles() {
        let mut blk = vec![0u8; 20];
        blk[0..2].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16(-1.0).to_le_bytes());
        blk[4] = 0x3a; // value 0 = 0xa, value 16 = 0x3
        let mut out = [0f32; 32];
        dequantize_row(GgmlType::Q4_1, &blk, &mut out);
        assert_eq!(out[0], 0.5 * 10.0 - 1.0);
        assert_eq!(out[16], 0.5 * 3.0 - 1.0);
        assert_eq!(out[1], -1.0);
    }

    #[test]
    fn dequantize_short_row_zero_fills_instead_of_panicking() {
        let mut out = [1f32; 64];
        dequantize_row(GgmlType::Q8_0, &[0u8; 40], &mut out);
        assert!(out[32..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn q8_quantization_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37).collect();
        let a = Q8Acts::quantize(&x, 1, 64);
        for b in 0..2 {
            let d = a.d[b];
            let mut sum = 0i32;
            for k in 0..32 {
                let q = a.qs[b * 32 + k] as i32;
                sum += q;
                assert!((q as f32 * d - x[b * 32 + k]).abs() <= d * 0.5 + 1e-6);
            }
            assert!((a.s[b] - d * sum as f32).abs() <= 1e-4);
        }
    }
}
