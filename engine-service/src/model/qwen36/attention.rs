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
use crate::backend::cpu::kernels::attention::attention_tree;
use crate::backend::cpu::kernels::{AttnParams, ThreadPool, attention, write_kv_scaled};
use crate::memory::{KvDtype, KvLayout};

use super::weights::{WeightSource, load_matrix};
use super::{Seg, grow, rms_norm_1p};
use crate::backend::cpu::ops::CpuMatrix;

#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub hq: usize,
    pub hkv: usize,
    pub hd: usize,
    /// Rotated dims per head (even).
    pub rot: usize,
    pub eps: f32,
}

pub struct AttnLayer {
    q_proj: CpuMatrix,
    k_proj: CpuMatrix,
    v_proj: CpuMatrix,
    o_proj: CpuMatrix,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
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

#[derive(Default)]
pub struct AttnScratch {
    qg: Vec<f32>,
    q: Vec<f32>,
    gate: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    tmp: Vec<f32>,
}

impl AttnLayer {
    /// Loads `p` (e.g. `layers.3.self_attn.`) with hidden size `h`.
    pub fn load(src: &dyn WeightSource, p: &str, d: &AttnDims, h: usize) -> Result<AttnLayer, EngineError> {
        Ok(AttnLayer {
            q_proj: load_matrix(src, &format!("{p}q_proj.weight"), 2 * d.hq * d.hd, h)?,
            k_proj: load_matrix(src, &format!("{p}k_proj.weight"), d.hkv * d.hd, h)?,
            v_proj: load_matrix(src, &format!("{p}v_proj.weight"), d.hkv * d.hd, h)?,
            o_proj: load_matrix(src, &format!("{p}o_proj.weight"), h, d.hq * d.hd)?,
            q_norm: src.vector(&format!("{p}q_norm.weight"), &[d.hd])?,
            k_norm: src.vector(&format!("{p}k_norm.weight"), &[d.hd])?,
            k_scale: kv_scale(src, &[format!("{p}k_proj.k_scale"), format!("{p}k_scale"), format!("{p}kv_scale")])?,
            v_scale: kv_scale(src, &[format!("{p}v_proj.v_scale"), format!("{p}v_scale"), format!("{p}kv_scale")])?,
        })
    }

    /// Bytes of the layer's weights in memory.
    pub fn weight_bytes(&self) -> usize {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj].iter().map(|w| w.bytes()).sum::<usize>()
            + 4 * (self.q_norm.len() + self.k_norm.len())
    }

    /// Runs the layer on `n` normed rows `xn`; `rope` holds `rot/2` (cos, sin) pairs per row.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        d: &AttnDims,
        pool: &ThreadPool,
        layout: &KvLayout,
        kv_layer: usize,
        xn: &[f32],
        n: usize,
        segs: &[Seg],
        rope: &[(f32, f32)],
        s: &mut AttnScratch,
        exact: Option<&mut [&mut Vec<f32>]>,
        out: &mut [f32],
    ) {
        let (hd, qd, kvd) = (d.hd, d.hq * d.hd, d.hkv * d.hd);
        let qg = grow(&mut s.qg, n * 2 * qd);
        self.q_proj.matmul(pool, xn, n, qg);
        let k = grow(&mut s.k, n * kvd);
        self.k_proj.matmul(pool, xn, n, k);
        let v = grow(&mut s.v, n * kvd);
        self.v_proj.matmul(pool, xn, n, v);

        // De-interleave [q_h | gate_h] per head.
        let q = grow(&mut s.q, n * qd);
        let gate = grow(&mut s.gate, n * qd);
        for r in 0..n {
            for h in 0..d.hq {
                let src = &s.qg[r * 2 * qd + 2 * h * hd..][..2 * hd];
                q[r * qd + h * hd..][..hd].copy_from_slice(&src[..hd]);
                gate[r * qd + h * hd..][..hd].copy_from_slice(&src[hd..]);
            }
        }
        let tmp = grow(&mut s.tmp, n * qd.max(kvd));
        tmp[..n * qd].copy_from_slice(&s.q[..n * qd]);
        rms_norm_1p(&tmp[..n * qd], &self.q_norm, d.eps, &mut s.q[..n * qd]);
        tmp[..n * kvd].copy_from_slice(&s.k[..n * kvd]);
        rms_norm_1p(&tmp[..n * kvd], &self.k_norm, d.eps, &mut s.k[..n * kvd]);
        let half = d.rot / 2;
        for r in 0..n {
            let cs = &rope[r * half..(r + 1) * half];
            for head in s.q[r * qd..(r + 1) * qd].chunks_exact_mut(hd) {
                rope_half(head, cs);
            }
            for head in s.k[r * kvd..(r + 1) * kvd].chunks_exact_mut(hd) {
                rope_half(head, cs);
            }
        }

        let attn = grow(&mut s.attn, n * qd);
        if let Some(stores) = exact {
            for (seg, store) in segs.iter().zip(stores.iter_mut()) {
                exact_attention(d, seg, &s.q, &s.k, &s.v, store, attn);
            }
            for (a, &g) in attn.iter_mut().zip(&s.gate[..n * qd]) {
                *a *= 1.0 / (1.0 + (-g).exp());
            }
            self.o_proj.matmul(pool, &s.attn[..n * qd], n, out);
            return;
        }
        let fp8 = layout.dtype == KvDtype::Fp8;
        let scale = 1.0 / (hd as f32).sqrt() * if fp8 { self.k_scale } else { 1.0 };
        let params = AttnParams { layer: kv_layer, n_heads: d.hq, n_kv_heads: d.hkv, head_dim: hd, scale };
        for seg in segs {
            for t in 0..seg.m {
                let r = seg.r0 + t;
                let (kr, vr) = (&s.k[r * kvd..(r + 1) * kvd], &s.v[r * kvd..(r + 1) * kvd]);
                write_kv_scaled(layout, seg.pages, kv_layer, seg.start_pos + t, kr, vr, self.k_scale, self.v_scale);
            }
            if seg.m > 0 {
                let rows = seg.r0 * qd..(seg.r0 + seg.m) * qd;
                let (q, o) = (&s.q[rows.clone()], &mut attn[rows]);
                match seg.keys {
                    Some(keys) => attention_tree(pool, layout, seg.pages, &params, seg.start_pos, keys, q, o),
                    None => attention(pool, layout, seg.pages, &params, seg.start_pos, q, seg.m, o),
                }
            }
        }
        if fp8 && self.v_scale != 1.0 {
            attn.iter_mut().for_each(|a| *a *= self.v_scale);
        }
        for (a, &g) in attn.iter_mut().zip(&s.gate[..n * qd]) {
            *a *= 1.0 / (1.0 + (-g).exp());
        }
        self.o_proj.matmul(pool, &s.attn[..n * qd], n, out);
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

/// Rotate-half RoPE on the first `2 * cs.len()` dims of one head: pairs `(i, i + half)`.
fn rope_half(head: &mut [f32], cs: &[(f32, f32)]) {
    let half = cs.len();
    for (i, &(c, s)) in cs.iter().enumerate() {
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * c - b * s;
        head[i + half] = b * c + a * s;
    }
}

/// `(cos, sin)` of `pos * inv_freq[i]`, computed in f32 as HF does (inverse frequencies and
/// the product rounded to f32 before the trig functions).
pub fn rope_row(pos: usize, inv_freq: &[f32], out: &mut [(f32, f32)]) {
    for (o, &f) in out.iter_mut().zip(inv_freq) {
        let angle = (pos as f32 * f) as f64;
        *o = (angle.cos() as f32, angle.sin() as f32);
    }
}

/// HF's inverse frequencies: `1 / theta^(2i/rot)` in f32.
pub fn rope_inv_freq(theta: f32, rot: usize) -> Vec<f32> {
    (0..rot / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / rot as f32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_half_rotates_pairs_i_and_i_plus_half_and_leaves_the_rest() {
        let mut head = [1.0, 0.0, 0.0, 1.0, 5.0, 6.0];
        let a = 0.3f32;
        let cs = [(a.cos(), a.sin()), (1.0, 0.0)];
        rope_half(&mut head, &cs);
        // Pair (0, 2): (1, 0) -> (cos, sin). Pair (1, 3): angle 0.
        assert!((head[0] - a.cos()).abs() < 1e-7 && (head[2] - a.sin()).abs() < 1e-7);
        assert_eq!(&head[1..2], &[0.0]);
        assert_eq!(&head[3..], &[1.0, 5.0, 6.0]);
    }
}
