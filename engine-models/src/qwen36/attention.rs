//! Gated full-attention layer of Qwen3.5 / Qwen3.6 (architecture spec §3.5), also the
//! mixer of the MTP module's decoder layer.
//!
//! Contract: [`AttnLayer::forward`] projects `q_proj` (per head interleaved `[q_h | gate_h]`),
//! `k_proj`, `v_proj`; applies the zero-centred q/k RMSNorm per head, then partial rotate-half
//! RoPE on the first `rot` dims of every head (the rest pass through); writes K and V of every
//! row into the sequence's KV pages (layer `kv_layer` of `layout`); runs the engine's paged
//! causal GQA attention kernel (scale `head_dim^-0.5`; the tree kernel for draft trees); multiplies by `sigmoid(gate)`; and
//! applies `o_proj`. The attention output of a row is bit-exact under any pass split (the
//! kernel's contract), so cached and uncached runs agree.
//! FP8 KV pages (spec 8.3): K (after norm and RoPE) and V are stored as E4M3(x / scale) with
//! the checkpoint's per-layer `k_scale` / `v_scale` (1.0 when absent); `k_scale` is folded into
//! the softmax scale and `v_scale` into the output. f16 pages ignore the scales.

use crate::EngineError;
use engine_ops::kv::{KvDtype, KvLayout};
use engine_ops::{AttnShape, KvWrite, Ops, RopeStyle, SeqKv};

use super::Seg;
use super::weights::{WeightSource, load_matrix, load_norm_1p};

#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub hq: usize,
    pub hkv: usize,
    pub hd: usize,
    /// Rotated dims per head (even).
    pub rot: usize,
    pub eps: f32,
}

pub struct AttnLayer<O: Ops> {
    q_proj: O::Matrix,
    k_proj: O::Matrix,
    v_proj: O::Matrix,
    o_proj: O::Matrix,
    /// The zero-centred q/k norms as `1 + w` (same bits as applying `(1 + w)` per call).
    q_norm: O::Vector,
    k_norm: O::Vector,
    /// FP8 KV scales (used only on FP8 pages).
    k_scale: f32,
    v_scale: f32,
}

/// The first present of `names` as a positive scalar, else 1.0 (spec 8.3).
fn kv_scale(src: &dyn WeightSource, names: &[String]) -> Result<f32, EngineError> {
    for name in names {
        if src.has(name) {
            let v = src.vector(name, &[]).or_else(|_| src.vector(name, &[1]))?[0];
            if !(v.is_finite() && v > 0.0) {
                return Err(EngineError::UnsupportedModel(format!("{name}: KV scale {v} is not positive and finite")));
            }
            return Ok(v);
        }
    }
    Ok(1.0)
}

/// Buffers reused across passes (grow-only).
pub struct AttnScratch<O: Ops> {
    /// `q_proj`'s rows (`[q_h | gate_h]` per head), and their halves.
    qg: O::Buf,
    q_raw: O::Buf,
    gate: O::Buf,
    /// q and k after their norms and RoPE.
    q: O::Buf,
    k_raw: O::Buf,
    k: O::Buf,
    v: O::Buf,
    attn: O::Buf,
}

impl<O: Ops> Default for AttnScratch<O> {
    fn default() -> Self {
        AttnScratch {
            qg: O::Buf::default(),
            q_raw: O::Buf::default(),
            gate: O::Buf::default(),
            q: O::Buf::default(),
            k_raw: O::Buf::default(),
            k: O::Buf::default(),
            v: O::Buf::default(),
            attn: O::Buf::default(),
        }
    }
}

impl<O: Ops> AttnLayer<O> {
    /// Loads `p` (e.g. `layers.3.self_attn.`) with hidden size `h`.
    pub fn load(ops: &O, src: &dyn WeightSource, p: &str, d: &AttnDims, h: usize) -> Result<AttnLayer<O>, EngineError> {
        Ok(AttnLayer {
            q_proj: load_matrix(ops, src, &format!("{p}q_proj.weight"), 2 * d.hq * d.hd, h)?,
            k_proj: load_matrix(ops, src, &format!("{p}k_proj.weight"), d.hkv * d.hd, h)?,
            v_proj: load_matrix(ops, src, &format!("{p}v_proj.weight"), d.hkv * d.hd, h)?,
            o_proj: load_matrix(ops, src, &format!("{p}o_proj.weight"), h, d.hq * d.hd)?,
            q_norm: load_norm_1p(ops, src, &format!("{p}q_norm.weight"), d.hd)?,
            k_norm: load_norm_1p(ops, src, &format!("{p}k_norm.weight"), d.hd)?,
            k_scale: kv_scale(src, &[format!("{p}k_proj.k_scale"), format!("{p}k_scale"), format!("{p}kv_scale")])?,
            v_scale: kv_scale(src, &[format!("{p}v_proj.v_scale"), format!("{p}v_scale"), format!("{p}kv_scale")])?,
        })
    }

    /// Bytes of the layer's weights in memory.
    pub fn weight_bytes(&self, d: &AttnDims) -> usize {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj].iter().map(|w| O::matrix_bytes(w)).sum::<usize>()
            + 4 * 2 * d.hd
    }

    /// Runs the layer on `n` normed rows `xn`; `rope` holds the rows' rotary angles
    /// ([`Ops::rope_table_f32`] of `rot/2` frequencies).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ops: &O,
        d: &AttnDims,
        layout: &KvLayout,
        kv_layer: usize,
        xn: &O::Buf,
        n: usize,
        segs: &[Seg],
        rope: &O::RopeTable,
        s: &mut AttnScratch<O>,
        exact: Option<&mut [&mut Vec<f32>]>,
        out: &mut O::Buf,
    ) {
        let (hd, qd, kvd) = (d.hd, d.hq * d.hd, d.hkv * d.hd);
        ops.grow(&mut s.qg, n * 2 * qd);
        ops.grow(&mut s.k_raw, n * kvd);
        ops.grow(&mut s.v, n * kvd);
        ops.matmul(xn, n, &mut [(&self.q_proj, &mut s.qg), (&self.k_proj, &mut s.k_raw), (&self.v_proj, &mut s.v)]);
        ops.grow(&mut s.q_raw, n * qd);
        ops.grow(&mut s.gate, n * qd);
        ops.deinterleave_heads(&s.qg, n, d.hq, hd, &mut s.q_raw, &mut s.gate);
        ops.grow(&mut s.q, n * qd);
        ops.rms_norm(&s.q_raw, &self.q_norm, d.eps, n * d.hq, &mut s.q);
        ops.grow(&mut s.k, n * kvd);
        ops.rms_norm(&s.k_raw, &self.k_norm, d.eps, n * d.hkv, &mut s.k);
        let style = RopeStyle::HalfSplit { rotated: d.rot };
        ops.rope(style, &mut s.q, qd, hd, rope);
        ops.rope(style, &mut s.k, kvd, hd, rope);

        ops.grow(&mut s.attn, n * qd);
        if let Some(stores) = exact {
            let (q, k, v) =
                (ops.to_host(&s.q, 0..n * qd), ops.to_host(&s.k, 0..n * kvd), ops.to_host(&s.v, 0..n * kvd));
            let mut attn = vec![0.0; n * qd];
            for (seg, store) in segs.iter().zip(stores.iter_mut()) {
                exact_attention(d, seg, &q, &k, &v, store, &mut attn);
            }
            ops.upload(&attn, &mut s.attn, 0);
        } else {
            let fp8 = layout.dtype == KvDtype::Fp8;
            let scale = 1.0 / (hd as f32).sqrt() * if fp8 { self.k_scale } else { 1.0 };
            let shape = AttnShape { layer: kv_layer, n_heads: d.hq, n_kv_heads: d.hkv, head_dim: hd, scale };
            for seg in segs {
                let seq = SeqKv {
                    layout,
                    pages: seg.pages,
                    start_pos: seg.start_pos,
                    rows: seg.r0..seg.r0 + seg.m,
                    tree: seg.keys,
                };
                let write = KvWrite { seq: &seq, layer: kv_layer, k_scale: self.k_scale, v_scale: self.v_scale };
                ops.write_kv(&write, &s.k, &s.v);
                ops.attention(&shape, &seq, &s.q, &mut s.attn);
            }
            if fp8 && self.v_scale != 1.0 {
                ops.scale(&mut s.attn, self.v_scale, n * qd);
            }
        }
        ops.sigmoid_mul(&mut s.attn, &s.gate, n * qd);
        ops.matmul(&s.attn, n, &mut [(&self.o_proj, out)]);
    }
}

/// Reference attention with f32 K/V kept in `store` (rows `[k | v]` per position): the
/// exactness check that isolates the f16 rounding of the KV pages. Not a serving path.
fn exact_attention(d: &AttnDims, seg: &Seg, q: &[f32], k: &[f32], v: &[f32], store: &mut Vec<f32>, attn: &mut [f32]) {
    let (hd, qd, kvd) = (d.hd, d.hq * d.hd, d.hkv * d.hd);
    store.truncate(seg.start_pos * 2 * kvd);
    for t in 0..seg.m {
        let r = seg.r0 + t;
        store.extend_from_slice(&k[r * kvd..(r + 1) * kvd]);
        store.extend_from_slice(&v[r * kvd..(r + 1) * kvd]);
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let group = d.hq / d.hkv;
    let mut w = Vec::new();
    for t in 0..seg.m {
        let r = seg.r0 + t;
        let n_keys = seg.start_pos + t + 1;
        for h in 0..d.hq {
            let kvh = h / group;
            let qh = &q[r * qd + h * hd..][..hd];
            w.clear();
            w.extend((0..n_keys).map(|p| {
                let kp = &store[p * 2 * kvd + kvh * hd..][..hd];
                qh.iter().zip(kp).map(|(a, b)| a * b).sum::<f32>() * scale
            }));
            let mx = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for x in w.iter_mut() {
                *x = (*x - mx).exp();
                sum += *x;
            }
            let o = &mut attn[r * qd + h * hd..][..hd];
            o.fill(0.0);
            for (p, &wp) in w.iter().enumerate() {
                let vp = &store[p * 2 * kvd + kvd + kvh * hd..][..hd];
                for (ov, &x) in o.iter_mut().zip(vp) {
                    *ov += wp / sum * x;
                }
            }
        }
    }
}

/// HF's inverse frequencies: `1 / theta^(2i/rot)` in f32.
pub fn rope_inv_freq(theta: f32, rot: usize) -> Vec<f32> {
    (0..rot / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / rot as f32)).collect()
}
