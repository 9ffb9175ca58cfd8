//! Gated DeltaNet (linear attention) layer of Qwen3.5 / Qwen3.6 (architecture spec §3.4).
//!
//! Contract: [`GdnLayer::forward`] runs the layer for the rows of several sequences at once,
//! reading and advancing each sequence's [`GdnState`] (conv window + fp32 delta-rule state).
//! Per token: `in_proj_qkv` → causal depthwise conv (kernel K, window of the last K-1 raw
//! projections kept in the state) → SiLU → split q | k | v → per-head L2 norm of q and k (eps
//! on the sum of squares), q scaled by `1/sqrt(d_k)` → gates `β = σ(b)`, `g = -exp(A_log) ·
//! softplus(a + dt_bias)` → delta rule per value head `j` with key head `j / (Hv/Hk)`
//! (consecutive grouping) → gated RMSNorm with `silu(z)` (plain weight) → `out_proj`.
//! Every step is an op of the seam ([`Ops::causal_conv1d_silu`], [`Ops::delta_rule`], ...).
//!
//! Two exact-in-math forms of the recurrence ([`GdnMode`]): token by token (a token's result
//! does not depend on how the sequence was split into passes, bit for bit) and chunked (the
//! WY/UT form HF uses for prefill; equal within f32 rounding). Decode steps (one token)
//! always use the recurrent form.

use crate::EngineError;
pub use engine_ops::{GDN_CHUNK as CHUNK, GdnDims, GdnMode, GdnState};
use engine_ops::{GdnSeq, GdnTree, Ops};

use super::Seg;
use super::weights::{WeightSource, load_matrix};

/// A zeroed state of one layer.
pub fn zero_state<O: Ops>(ops: &O, d: &GdnDims) -> GdnState<O::Buf> {
    let mut st = GdnState::default();
    reset_state(ops, d, &mut st);
    st
}

/// Zeroes `st` (a sequence starting over).
pub fn reset_state<O: Ops>(ops: &O, d: &GdnDims, st: &mut GdnState<O::Buf>) {
    ops.zeros(&mut st.conv, d.conv_state_len());
    ops.zeros(&mut st.ssm, d.ssm_state_len());
}

pub struct GdnLayer<O: Ops> {
    in_proj_qkv: O::Matrix,
    in_proj_z: O::Matrix,
    in_proj_b: O::Matrix,
    in_proj_a: O::Matrix,
    out_proj: O::Matrix,
    /// Conv weights transposed to `[K][conv_dim]` (tap-major: one tap is a contiguous row).
    conv_w: O::Vector,
    dt_bias: O::Vector,
    /// `-exp(A_log)`.
    neg_a: O::Vector,
    /// Gated-norm weight `[d_v]`, shared by all heads.
    norm: O::Vector,
    /// Bytes of the vectors above.
    vector_bytes: usize,
}

/// Buffers reused across passes (grow-only).
pub struct GdnScratch<O: Ops> {
    qkv: O::Buf,
    conv: O::Buf,
    z: O::Buf,
    b: O::Buf,
    a: O::Buf,
    o: O::Buf,
}

impl<O: Ops> Default for GdnScratch<O> {
    fn default() -> Self {
        GdnScratch {
            qkv: O::Buf::default(),
            conv: O::Buf::default(),
            z: O::Buf::default(),
            b: O::Buf::default(),
            a: O::Buf::default(),
            o: O::Buf::default(),
        }
    }
}

impl<O: Ops> GdnLayer<O> {
    /// Loads layer `p` (e.g. `layers.0.linear_attn.`) with hidden size `h`.
    pub fn load(ops: &O, src: &dyn WeightSource, p: &str, d: &GdnDims, h: usize) -> Result<GdnLayer<O>, EngineError> {
        let cd = d.conv_dim();
        let raw = src.vector(&format!("{p}conv1d.weight"), &[cd, 1, d.kconv])?;
        let mut conv_w = vec![0.0; cd * d.kconv];
        for c in 0..cd {
            for j in 0..d.kconv {
                conv_w[j * cd + c] = raw[c * d.kconv + j];
            }
        }
        let a_log = src.vector(&format!("{p}A_log"), &[d.hv])?;
        let neg_a: Vec<f32> = a_log.iter().map(|&x| -x.exp()).collect();
        let dt_bias = src.vector(&format!("{p}dt_bias"), &[d.hv])?;
        let norm = src.vector(&format!("{p}norm.weight"), &[d.dv])?;
        Ok(GdnLayer {
            in_proj_qkv: load_matrix(ops, src, &format!("{p}in_proj_qkv.weight"), cd, h)?,
            in_proj_z: load_matrix(ops, src, &format!("{p}in_proj_z.weight"), d.value_dim(), h)?,
            in_proj_b: load_matrix(ops, src, &format!("{p}in_proj_b.weight"), d.hv, h)?,
            in_proj_a: load_matrix(ops, src, &format!("{p}in_proj_a.weight"), d.hv, h)?,
            out_proj: load_matrix(ops, src, &format!("{p}out_proj.weight"), h, d.value_dim())?,
            vector_bytes: 4 * (conv_w.len() + 3 * norm.len().max(neg_a.len())),
            conv_w: ops.vector_from(&conv_w),
            dt_bias: ops.vector_from(&dt_bias),
            neg_a: ops.vector_from(&neg_a),
            norm: ops.vector_from(&norm),
        })
    }

    /// Bytes of the layer's weights in memory.
    pub fn weight_bytes(&self) -> usize {
        let mats = [&self.in_proj_qkv, &self.in_proj_z, &self.in_proj_b, &self.in_proj_a, &self.out_proj];
        mats.iter().map(|w| O::matrix_bytes(w)).sum::<usize>() + self.vector_bytes
    }

    /// Runs the layer on `xn` (`n` normed rows of width `h`), rows grouped by `segs`, with
    /// `states[i]` the state of `segs[i]` and `tree_nodes[i]` its draft tree's node states;
    /// writes `n x h` into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ops: &O,
        d: &GdnDims,
        xn: &O::Buf,
        n: usize,
        segs: &[Seg],
        states: &mut [&mut GdnState<O::Buf>],
        tree_nodes: &mut [Option<&mut Vec<GdnState<O::Buf>>>],
        mode: GdnMode,
        s: &mut GdnScratch<O>,
        out: &mut O::Buf,
    ) {
        let (cd, vd, hv) = (d.conv_dim(), d.value_dim(), d.hv);
        ops.grow(&mut s.qkv, n * cd);
        ops.grow(&mut s.z, n * vd);
        ops.grow(&mut s.b, n * hv);
        ops.grow(&mut s.a, n * hv);
        ops.matmul(
            xn,
            n,
            &mut [
                (&self.in_proj_qkv, &mut s.qkv),
                (&self.in_proj_z, &mut s.z),
                (&self.in_proj_b, &mut s.b),
                (&self.in_proj_a, &mut s.a),
            ],
        );
        // b -> beta, a -> g (log decay).
        ops.gdn_gates(&mut s.b, &mut s.a, &self.neg_a, &self.dt_bias, n);

        let mut seqs: Vec<GdnSeq<'_, O::Buf>> = Vec::with_capacity(segs.len());
        for ((seg, st), nodes) in segs.iter().zip(states.iter_mut()).zip(tree_nodes.iter_mut()) {
            let tree = match (seg.tree, nodes.as_deref_mut()) {
                (Some(parents), Some(nodes)) => {
                    // Recycled node states are fine as they are: every one is overwritten.
                    nodes.truncate(seg.m);
                    while nodes.len() < seg.m {
                        nodes.push(zero_state(ops, d));
                    }
                    Some(GdnTree { parents, nodes: &mut nodes[..] })
                }
                _ => None,
            };
            seqs.push(GdnSeq { rows: seg.r0..seg.r0 + seg.m, state: &mut **st, tree });
        }
        ops.grow(&mut s.conv, n * cd);
        ops.causal_conv1d_silu(d, &self.conv_w, &s.qkv, &mut seqs, &mut s.conv);
        ops.gdn_qk_norm(d, &mut s.conv, n);
        ops.grow(&mut s.o, n * vd);
        ops.delta_rule(d, mode, &s.conv, &s.b, &s.a, &mut seqs, &mut s.o);
        ops.gated_rms_norm(&mut s.o, &s.z, &self.norm, d.eps, n * hv);
        ops.matmul(&s.o, n, &mut [(&self.out_proj, out)]);
    }
}
