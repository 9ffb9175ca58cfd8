//! Gated DeltaNet (linear attention) layer of Qwen3.5 / Qwen3.6 (architecture spec §3.4).
//!
//! Contract: [`GdnLayer::forward`] runs the layer for the rows of several sequences at once,
//! reading and advancing each sequence's [`GdnState`] (conv window + fp32 delta-rule state).
//! Per token: `in_proj_qkv` → causal depthwise conv (kernel K, window of the last K-1 raw
//! projections kept in the state) → SiLU → split q | k | v → per-head L2 norm of q and k (eps
//! on the sum of squares), q scaled by `1/sqrt(d_k)` → gates `β = σ(b)`, `g = -exp(A_log) ·
//! softplus(a + dt_bias)` → delta rule per value head `j` with key head `j / (Hv/Hk)`
//! (consecutive grouping) → gated RMSNorm with `silu(z)` (plain weight) → `out_proj`.
//!
//! Two exact-in-math forms of the recurrence: [`GdnMode::Recurrent`] (token by token; the
//! result for a token does not depend on how the sequence was split into passes, bit for bit)
//! and [`GdnMode::Chunked`] (chunks of [`CHUNK`] tokens, the WY/UT form HF uses for prefill;
//! equal to the recurrent form within f32 rounding). Decode steps (one token) always use the
//! recurrent form. Work is split across the pool by (sequence, value head).

use crate::EngineError;
use crate::backend::cpu::kernels::ThreadPool;
use crate::backend::cpu::kernels::delta_rule::{DeltaToken, delta_rule};
use crate::backend::cpu::kernels::threadpool::split_range;

use super::weights::{WeightSource, load_matrix};
use super::{Seg, grow};
use crate::backend::cpu::ops::CpuMatrix;

/// Tokens per chunk of the chunked form (HF's value).
pub const CHUNK: usize = 64;

/// Which form of the delta rule multi-token passes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnMode {
    Recurrent,
    Chunked,
}

/// Shape of every GDN layer of a model.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    /// Conv kernel width K.
    pub kconv: usize,
    pub eps: f32,
}

impl GdnDims {
    pub fn key_dim(&self) -> usize {
        self.hk * self.dk
    }
    pub fn value_dim(&self) -> usize {
        self.hv * self.dv
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// f32 values of one layer's conv window: `[K-1][conv_dim]`, oldest first.
    pub fn conv_state_len(&self) -> usize {
        (self.kconv - 1) * self.conv_dim()
    }
    /// f32 values of one layer's delta-rule state: `[Hv][d_k][d_v]`.
    pub fn ssm_state_len(&self) -> usize {
        self.hv * self.dk * self.dv
    }
}

/// One sequence's state for one GDN layer.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnState {
    /// Raw `in_proj_qkv` outputs of the last K-1 tokens, `[K-1][conv_dim]`, oldest first.
    pub conv: Vec<f32>,
    /// `[Hv][d_k][d_v]`: S such that `o = Sᵀ q`.
    pub ssm: Vec<f32>,
}

impl GdnState {
    pub fn zeros(d: &GdnDims) -> GdnState {
        GdnState { conv: vec![0.0; d.conv_state_len()], ssm: vec![0.0; d.ssm_state_len()] }
    }
    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }
}

pub struct GdnLayer {
    in_proj_qkv: CpuMatrix,
    in_proj_z: CpuMatrix,
    in_proj_b: CpuMatrix,
    in_proj_a: CpuMatrix,
    out_proj: CpuMatrix,
    /// Conv weights transposed to `[K][conv_dim]` (tap-major: one tap is a contiguous row).
    conv_w: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `-exp(A_log)`.
    neg_a: Vec<f32>,
    /// Gated-norm weight `[d_v]`, shared by all heads.
    norm: Vec<f32>,
}

/// Buffers reused across passes (grow-only).
#[derive(Default)]
pub struct GdnScratch {
    qkv: Vec<f32>,
    conv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    o: Vec<f32>,
}

impl GdnLayer {
    /// Loads layer `p` (e.g. `layers.0.linear_attn.`) with hidden size `h`.
    pub fn load(src: &dyn WeightSource, p: &str, d: &GdnDims, h: usize) -> Result<GdnLayer, EngineError> {
        let cd = d.conv_dim();
        let raw = src.vector(&format!("{p}conv1d.weight"), &[cd, 1, d.kconv])?;
        let mut conv_w = vec![0.0; cd * d.kconv];
        for c in 0..cd {
            for j in 0..d.kconv {
                conv_w[j * cd + c] = raw[c * d.kconv + j];
            }
        }
        let a_log = src.vector(&format!("{p}A_log"), &[d.hv])?;
        Ok(GdnLayer {
            in_proj_qkv: load_matrix(src, &format!("{p}in_proj_qkv.weight"), cd, h)?,
            in_proj_z: load_matrix(src, &format!("{p}in_proj_z.weight"), d.value_dim(), h)?,
            in_proj_b: load_matrix(src, &format!("{p}in_proj_b.weight"), d.hv, h)?,
            in_proj_a: load_matrix(src, &format!("{p}in_proj_a.weight"), d.hv, h)?,
            out_proj: load_matrix(src, &format!("{p}out_proj.weight"), h, d.value_dim())?,
            conv_w,
            dt_bias: src.vector(&format!("{p}dt_bias"), &[d.hv])?,
            neg_a: a_log.iter().map(|&x| -x.exp()).collect(),
            norm: src.vector(&format!("{p}norm.weight"), &[d.dv])?,
        })
    }

    /// Bytes of the layer's weights in memory.
    pub fn weight_bytes(&self) -> usize {
        let mats = [&self.in_proj_qkv, &self.in_proj_z, &self.in_proj_b, &self.in_proj_a, &self.out_proj];
        mats.iter().map(|w| w.bytes()).sum::<usize>()
            + 4 * (self.conv_w.len() + 3 * self.norm.len().max(self.neg_a.len()))
    }

    /// Runs the layer on `xn` (`n` normed rows of width `h`), rows grouped by `segs`, with
    /// `states[i]` the state of `segs[i]`; writes `n x h` into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        d: &GdnDims,
        pool: &ThreadPool,
        xn: &[f32],
        n: usize,
        segs: &[Seg],
        states: &mut [&mut GdnState],
        tree_nodes: &mut [Option<&mut Vec<GdnState>>],
        mode: GdnMode,
        s: &mut GdnScratch,
        out: &mut [f32],
    ) {
        let (cd, vd, hv) = (d.conv_dim(), d.value_dim(), d.hv);
        let qkv = grow(&mut s.qkv, n * cd);
        self.in_proj_qkv.matmul(pool, xn, n, qkv);
        let z = grow(&mut s.z, n * vd);
        self.in_proj_z.matmul(pool, xn, n, z);
        let b = grow(&mut s.b, n * hv);
        self.in_proj_b.matmul(pool, xn, n, b);
        let a = grow(&mut s.a, n * hv);
        self.in_proj_a.matmul(pool, xn, n, a);

        // Gates, in place: b -> beta, a -> g (log decay).
        for r in 0..n {
            for j in 0..hv {
                let bb = &mut s.b[r * hv + j];
                *bb = 1.0 / (1.0 + (-*bb).exp());
                let aa = &mut s.a[r * hv + j];
                *aa = self.neg_a[j] * softplus(*aa + self.dt_bias[j]);
            }
        }

        let conv = grow(&mut s.conv, n * cd);
        for ((seg, st), nodes) in segs.iter().zip(states.iter_mut()).zip(tree_nodes.iter_mut()) {
            match (seg.tree, nodes) {
                (Some(parents), Some(nodes)) => {
                    // Recycled node states are fine as they are: every one is overwritten.
                    nodes.truncate(seg.m);
                    while nodes.len() < seg.m {
                        nodes.push(GdnState::zeros(d));
                    }
                    self.conv_tree(d, &s.qkv, conv, seg, parents, &st.conv, nodes);
                }
                _ => self.conv_seg(d, &s.qkv, conv, seg, &mut st.conv),
            }
        }

        let o = grow(&mut s.o, n * vd);
        let tasks: Vec<(usize, usize)> = (0..segs.len()).flat_map(|si| (0..hv).map(move |j| (si, j))).collect();
        let ssm: Vec<SyncPtr> = states.iter_mut().map(|st| SyncPtr(st.ssm.as_mut_ptr())).collect();
        // Tree segments: every node's own state (the sequence's state stays the root's input).
        let node_ssm: Vec<Vec<SyncPtr>> = tree_nodes
            .iter_mut()
            .map(|nodes| {
                nodes.as_mut().map_or(Vec::new(), |v| v.iter_mut().map(|st| SyncPtr(st.ssm.as_mut_ptr())).collect())
            })
            .collect();
        let ctx = HeadCtx {
            d: *d,
            conv: &s.conv[..n * cd],
            beta: &s.b[..n * hv],
            g: &s.a[..n * hv],
            z: &s.z[..n * vd],
            norm: &self.norm,
            o: SyncPtr(o.as_mut_ptr()),
        };
        pool.run(|ti, nt| {
            for &(si, j) in &tasks[split_range(tasks.len(), nt, ti, 1)] {
                let seg = &segs[si];
                // SAFETY: each (sequence, head) task owns head j's state block and head j's
                // output columns of its sequence's rows; no two tasks share either.
                unsafe {
                    let st = std::slice::from_raw_parts_mut(ssm[si].0.add(j * d.dk * d.dv), d.dk * d.dv);
                    if let Some(parents) = seg.tree {
                        ctx.tree_head(seg, parents, j, st, &node_ssm[si]);
                    } else if mode == GdnMode::Chunked && seg.m > 1 {
                        ctx.chunked_head(seg, j, st);
                    } else {
                        ctx.recurrent_head(seg, j, st);
                    }
                    ctx.gated_norm(seg, j);
                }
            }
        });
        self.out_proj.matmul(pool, &s.o[..n * vd], n, out);
    }

    /// Causal conv + SiLU + q/k L2 norm for one sequence's rows; advances its conv window.
    fn conv_seg(&self, d: &GdnDims, qkv: &[f32], conv: &mut [f32], seg: &Seg, window: &mut [f32]) {
        let (cd, k) = (d.conv_dim(), d.kconv);
        let hist = k - 1;
        for t in 0..seg.m {
            let row = seg.r0 + t;
            let dst = &mut conv[row * cd..(row + 1) * cd];
            dst.fill(0.0);
            for j in 0..k {
                // Tap j reads the token at relative time t + j - (K-1).
                let rel = t as isize + j as isize - hist as isize;
                let src = if rel >= 0 {
                    &qkv[(seg.r0 + rel as usize) * cd..][..cd]
                } else {
                    &window[(hist as isize + rel) as usize * cd..][..cd]
                };
                let w = &self.conv_w[j * cd..(j + 1) * cd];
                for ((o, &x), &wt) in dst.iter_mut().zip(src).zip(w) {
                    *o += wt * x;
                }
            }
            finish_conv_row(d, dst);
        }
        // New window: the last K-1 raw rows of (old window ++ this pass's rows).
        if seg.m >= hist {
            window.copy_from_slice(&qkv[(seg.r0 + seg.m - hist) * cd..(seg.r0 + seg.m) * cd]);
        } else if seg.m > 0 {
            window.copy_within(seg.m * cd.., 0);
            let keep = (hist - seg.m) * cd;
            window[keep..].copy_from_slice(&qkv[seg.r0 * cd..(seg.r0 + seg.m) * cd]);
        }
    }

    /// [`GdnLayer::conv_seg`] for a draft tree: node `t` convolves its parent's window (the
    /// root: the sequence's window) with its own projection, exactly as a chain token does, and
    /// leaves its own window in `nodes[t].conv`. The sequence's window is not changed.
    #[allow(clippy::too_many_arguments)]
    fn conv_tree(
        &self,
        d: &GdnDims,
        qkv: &[f32],
        conv: &mut [f32],
        seg: &Seg,
        parents: &[Option<usize>],
        root_window: &[f32],
        nodes: &mut [GdnState],
    ) {
        let (cd, k) = (d.conv_dim(), d.kconv);
        let hist = k - 1;
        for (t, parent) in parents.iter().enumerate().take(seg.m) {
            let row = seg.r0 + t;
            let raw = &qkv[row * cd..(row + 1) * cd];
            let (done, rest) = nodes.split_at_mut(t);
            let parent_win: &[f32] = match *parent {
                Some(p) => &done[p].conv,
                None => root_window,
            };
            let dst = &mut conv[row * cd..(row + 1) * cd];
            dst.fill(0.0);
            for j in 0..k {
                let src = if j == hist { raw } else { &parent_win[j * cd..(j + 1) * cd] };
                let w = &self.conv_w[j * cd..(j + 1) * cd];
                for ((o, &x), &wt) in dst.iter_mut().zip(src).zip(w) {
                    *o += wt * x;
                }
            }
            finish_conv_row(d, dst);
            let win = &mut rest[0].conv;
            if hist > 0 {
                win[..(hist - 1) * cd].copy_from_slice(&parent_win[cd..hist * cd]);
                win[(hist - 1) * cd..].copy_from_slice(raw);
            }
        }
    }
}

/// SiLU, then the per-head L2 norm of q and k (q also scaled by `1/sqrt(d_k)`), in place.
fn finish_conv_row(d: &GdnDims, dst: &mut [f32]) {
    for v in dst.iter_mut() {
        *v = silu(*v);
    }
    let scale = 1.0 / (d.dk as f32).sqrt();
    let (qk, _) = dst.split_at_mut(2 * d.key_dim());
    for (hi, head) in qk.chunks_exact_mut(d.dk).enumerate() {
        let ss: f32 = head.iter().map(|x| x * x).sum();
        let mut inv = 1.0 / (ss + 1e-6).sqrt();
        if hi < d.hk {
            inv *= scale;
        }
        for x in head.iter_mut() {
            *x *= inv;
        }
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: tasks write disjoint ranges (see `forward`).
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

/// What every (sequence, head) task reads; `o` is written at disjoint ranges.
struct HeadCtx<'a> {
    d: GdnDims,
    conv: &'a [f32],
    beta: &'a [f32],
    g: &'a [f32],
    z: &'a [f32],
    norm: &'a [f32],
    o: SyncPtr,
}

impl HeadCtx<'_> {
    fn q(&self, row: usize, j: usize) -> &[f32] {
        let d = &self.d;
        let kh = j / (d.hv / d.hk);
        &self.conv[row * d.conv_dim() + kh * d.dk..][..d.dk]
    }
    fn k(&self, row: usize, j: usize) -> &[f32] {
        let d = &self.d;
        let kh = j / (d.hv / d.hk);
        &self.conv[row * d.conv_dim() + d.key_dim() + kh * d.dk..][..d.dk]
    }
    fn v(&self, row: usize, j: usize) -> &[f32] {
        let d = &self.d;
        &self.conv[row * d.conv_dim() + 2 * d.key_dim() + j * d.dv..][..d.dv]
    }
    /// # Safety
    /// The caller owns head j's columns of `row` (tasks write disjoint ranges of `o`, which is
    /// why this hands out `&mut` from `&self`).
    #[allow(clippy::mut_from_ref)]
    unsafe fn o(&self, row: usize, j: usize) -> &mut [f32] {
        let d = &self.d;
        unsafe { std::slice::from_raw_parts_mut(self.o.0.add(row * d.value_dim() + j * d.dv), d.dv) }
    }

    /// The delta rule's inputs for head `j` of `row`.
    fn token(&self, row: usize, j: usize) -> DeltaToken<'_> {
        let hv = self.d.hv;
        DeltaToken {
            q: self.q(row, j),
            k: self.k(row, j),
            v: self.v(row, j),
            gamma: self.g[row * hv + j].exp(),
            beta: self.beta[row * hv + j],
        }
    }

    /// Token-by-token delta rule for head `j` over the rows of `seg` (the CPU kernel layer's
    /// [`delta_rule`]).
    unsafe fn recurrent_head(&self, seg: &Seg, j: usize, st: &mut [f32]) {
        let rows = seg.r0..seg.r0 + seg.m;
        let tokens: Vec<DeltaToken> = rows.clone().map(|row| self.token(row, j)).collect();
        // SAFETY: forwarded from the caller.
        let mut out: Vec<&mut [f32]> = rows.map(|row| unsafe { self.o(row, j) }).collect();
        delta_rule(st, self.d.dk, self.d.dv, &tokens, &mut out);
    }

    /// The delta rule for head `j` over a draft tree: node `t` starts from its parent's state
    /// (the root from `root`, which is left unchanged) and leaves its own in `nodes[t]`.
    ///
    /// # Safety
    /// As [`HeadCtx::recurrent_head`]; `nodes[t]` point at `Hv·d_k·d_v` values each, of
    /// which this task owns head j's block.
    unsafe fn tree_head(&self, seg: &Seg, parents: &[Option<usize>], j: usize, root: &[f32], nodes: &[SyncPtr]) {
        let block = self.d.dk * self.d.dv;
        for (t, parent) in parents.iter().enumerate().take(seg.m) {
            // SAFETY: head j's block of node t (written here) and of its parent (< t, done).
            unsafe {
                let st = std::slice::from_raw_parts_mut(nodes[t].0.add(j * block), block);
                match *parent {
                    Some(p) => st.copy_from_slice(std::slice::from_raw_parts(nodes[p].0.add(j * block), block)),
                    None => st.copy_from_slice(root),
                }
                let row = seg.r0 + t;
                delta_rule(st, self.d.dk, self.d.dv, &[self.token(row, j)], &mut [self.o(row, j)]);
            }
        }
    }

    /// Chunked (WY) form of the same recurrence for head `j` (spec §3.4, "Chunked form").
    unsafe fn chunked_head(&self, seg: &Seg, j: usize, st: &mut [f32]) {
        let (dk, dv, hv) = (self.d.dk, self.d.dv, self.d.hv);
        let mut gam = vec![0.0f32; CHUNK];
        let mut amat = vec![0.0f32; CHUNK * CHUNK];
        let mut u = vec![0.0f32; CHUNK * dv];
        let mut w = vec![0.0f32; CHUNK * dk];
        let mut qs = vec![0.0f32; dv];
        let mut t0 = 0;
        while t0 < seg.m {
            let c = CHUNK.min(seg.m - t0);
            let row = |i: usize| seg.r0 + t0 + i;
            let mut acc = 0.0f32;
            for (i, gi) in gam.iter_mut().enumerate().take(c) {
                acc += self.g[row(i) * hv + j];
                *gi = acc;
            }
            // A[i][l] = β_i (k_i·k_l) e^{Γ_i - Γ_l}, l < i.
            for i in 0..c {
                let ki = self.k(row(i), j);
                let bi = self.beta[row(i) * hv + j];
                for l in 0..i {
                    amat[i * CHUNK + l] = bi * dot(ki, self.k(row(l), j)) * (gam[i] - gam[l]).exp();
                }
            }
            // Forward substitution: U = (I+A)^-1 (β V), W = (I+A)^-1 (β e^Γ K).
            for i in 0..c {
                let bi = self.beta[row(i) * hv + j];
                let eg = gam[i].exp();
                let (done_u, cur_u) = u.split_at_mut(i * dv);
                let cur_u = &mut cur_u[..dv];
                for (x, &vv) in cur_u.iter_mut().zip(self.v(row(i), j)) {
                    *x = bi * vv;
                }
                let (done_w, cur_w) = w.split_at_mut(i * dk);
                let cur_w = &mut cur_w[..dk];
                for (x, &kv) in cur_w.iter_mut().zip(self.k(row(i), j)) {
                    *x = bi * eg * kv;
                }
                for l in 0..i {
                    let al = amat[i * CHUNK + l];
                    axpy(-al, &done_u[l * dv..(l + 1) * dv], cur_u);
                    axpy(-al, &done_w[l * dk..(l + 1) * dk], cur_w);
                }
            }
            // V' = U - W S0 (into u).
            for i in 0..c {
                let ui = &mut u[i * dv..(i + 1) * dv];
                for (kk, &wk) in w[i * dk..(i + 1) * dk].iter().enumerate() {
                    axpy(-wk, &st[kk * dv..(kk + 1) * dv], ui);
                }
            }
            // O_i = e^{Γ_i} q_i S0 + Σ_{l<=i} (q_i·k_l) e^{Γ_i-Γ_l} V'_l.
            for i in 0..c {
                let qi = self.q(row(i), j);
                qs.fill(0.0);
                for (kk, &qv) in qi.iter().enumerate() {
                    axpy(qv, &st[kk * dv..(kk + 1) * dv], &mut qs);
                }
                let eg = gam[i].exp();
                // SAFETY: forwarded from the caller.
                let o = unsafe { self.o(row(i), j) };
                for (ov, &x) in o.iter_mut().zip(&qs) {
                    *ov = eg * x;
                }
                for l in 0..=i {
                    let coef = dot(qi, self.k(row(l), j)) * (gam[i] - gam[l]).exp();
                    axpy(coef, &u[l * dv..(l + 1) * dv], o);
                }
            }
            // S_C = e^{Γ_C} S0 + Σ_i e^{Γ_C-Γ_i} k_i ⊗ V'_i.
            let last = gam[c - 1];
            let el = last.exp();
            for x in st.iter_mut() {
                *x *= el;
            }
            for i in 0..c {
                let f = (last - gam[i]).exp();
                let ki = self.k(row(i), j);
                let ui = &u[i * dv..(i + 1) * dv];
                for (kk, &kv) in ki.iter().enumerate() {
                    axpy(f * kv, ui, &mut st[kk * dv..(kk + 1) * dv]);
                }
            }
            t0 += c;
        }
    }

    /// `o ← rmsnorm(o) · w · silu(z)` for head `j` of every row of `seg`.
    unsafe fn gated_norm(&self, seg: &Seg, j: usize) {
        let dv = self.d.dv;
        for row in seg.r0..seg.r0 + seg.m {
            // SAFETY: forwarded from the caller.
            let o = unsafe { self.o(row, j) };
            let z = &self.z[row * self.d.value_dim() + j * dv..][..dv];
            let ss: f32 = o.iter().map(|x| x * x).sum();
            let inv = 1.0 / (ss / dv as f32 + self.d.eps).sqrt();
            for ((ov, &w), &zv) in o.iter_mut().zip(self.norm).zip(z) {
                *ov = *ov * inv * w * silu(zv);
            }
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

pub(super) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// PyTorch's softplus (threshold 20: linear above).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}
