//! Gated DeltaNet on the CPU (Qwen3.5 / Qwen3.6 linear-attention layers, architecture spec
//! §3.4): the gates, the causal conv with its window, the q/k L2 norm, the delta rule in its
//! recurrent, chunked and draft-tree forms, and the gated RMSNorm. These loops were the
//! model's own before the op seam; their formulas (and so their bits) are unchanged.
//!
//! Work of the delta rule is split across the pool by (sequence, value head): each task owns
//! its head's block of the sequence's state and its head's columns of the output rows.

use super::delta_rule::{DeltaToken, delta_rule};
use super::threadpool::{SPLIT_MIN_ROWS, ThreadPool, split_range};
use engine_ops::{GDN_CHUNK, GdnDims, GdnMode, GdnSeq, GdnState};

use super::activation::{silu_in_place, silu_scalar};

/// PyTorch's softplus (threshold 20: linear above).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `beta = σ(beta)`, `g = neg_a · softplus(g + dt_bias)` over rows of `neg_a.len()` heads.
pub fn gates(beta: &mut [f32], g: &mut [f32], neg_a: &[f32], dt_bias: &[f32]) {
    let hv = neg_a.len();
    for (br, gr) in beta.chunks_exact_mut(hv).zip(g.chunks_exact_mut(hv)) {
        for j in 0..hv {
            br[j] = 1.0 / (1.0 + (-br[j]).exp());
            gr[j] = neg_a[j] * softplus(gr[j] + dt_bias[j]);
        }
    }
}

/// Causal conv + SiLU of every sequence's rows (see `Ops::causal_conv1d_silu`); a chain's
/// channels are split across the pool (each channel's arithmetic is the same either way).
pub fn causal_conv1d_silu(
    pool: &ThreadPool,
    d: &GdnDims,
    taps: &[f32],
    qkv: &[f32],
    seqs: &mut [GdnSeq<'_, Vec<f32>>],
    out: &mut [f32],
) {
    for seq in seqs.iter_mut() {
        match seq.tree.as_mut() {
            Some(t) => conv_tree(d, taps, qkv, out, seq.rows.clone(), t.parents, &seq.state.conv, t.nodes),
            None => conv_chain(pool, d, taps, qkv, out, seq.rows.clone(), &mut seq.state.conv),
        }
    }
}

/// One chain's rows; advances its conv window.
fn conv_chain(
    pool: &ThreadPool,
    d: &GdnDims,
    taps: &[f32],
    qkv: &[f32],
    conv: &mut [f32],
    rows: std::ops::Range<usize>,
    window: &mut [f32],
) {
    let (cd, k) = (d.conv_dim(), d.kconv);
    let hist = k - 1;
    let (r0, m) = (rows.start, rows.len());
    let convp = SyncPtr(conv.as_mut_ptr());
    let old_window: &[f32] = window;
    let channels = |cols: std::ops::Range<usize>| {
        let base = convp;
        for t in 0..m {
            let row = r0 + t;
            // SAFETY: channels `cols` of the pass's rows belong to this call alone (the
            // callers split the channels into disjoint ranges); `conv` outlives it.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.0.add(row * cd + cols.start), cols.len()) };
            dst.fill(0.0);
            for j in 0..k {
                // Tap j reads the token at relative time t + j - (K-1).
                let rel = t as isize + j as isize - hist as isize;
                let src = if rel >= 0 {
                    &qkv[(r0 + rel as usize) * cd..][..cd]
                } else {
                    &old_window[(hist as isize + rel) as usize * cd..][..cd]
                };
                add_tap(dst, &src[cols.clone()], &taps[j * cd + cols.start..j * cd + cols.end]);
            }
            silu_in_place(dst);
        }
    };
    if m >= SPLIT_MIN_ROWS {
        pool.run(|ti, nt| channels(split_range(cd, nt, ti, 16)));
    } else {
        channels(0..cd);
    }
    // New window: the last K-1 raw rows of (old window ++ this pass's rows).
    if m >= hist {
        window.copy_from_slice(&qkv[(r0 + m - hist) * cd..(r0 + m) * cd]);
    } else if m > 0 {
        window.copy_within(m * cd.., 0);
        let keep = (hist - m) * cd;
        window[keep..].copy_from_slice(&qkv[r0 * cd..(r0 + m) * cd]);
    }
}

/// `dst += w * src` element-wise: one conv tap.
#[inline]
fn add_tap(dst: &mut [f32], src: &[f32], w: &[f32]) {
    for ((o, &x), &wt) in dst.iter_mut().zip(src).zip(w) {
        *o += wt * x;
    }
}

/// A draft tree's rows: node `t` convolves its parent's window (the root: the sequence's)
/// with its own projection, exactly as a chain token does, and leaves its own window in
/// `nodes[t].conv`.
#[allow(clippy::too_many_arguments)]
fn conv_tree(
    d: &GdnDims,
    taps: &[f32],
    qkv: &[f32],
    conv: &mut [f32],
    rows: std::ops::Range<usize>,
    parents: &[Option<usize>],
    root_window: &[f32],
    nodes: &mut [GdnState<Vec<f32>>],
) {
    let (cd, k) = (d.conv_dim(), d.kconv);
    let hist = k - 1;
    for (t, parent) in parents.iter().enumerate().take(rows.len()) {
        let row = rows.start + t;
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
            add_tap(dst, src, &taps[j * cd..(j + 1) * cd]);
        }
        silu_in_place(dst);
        let win = &mut rest[0].conv;
        win.resize(d.conv_state_len(), 0.0);
        if hist > 0 {
            win[..(hist - 1) * cd].copy_from_slice(&parent_win[cd..hist * cd]);
            win[(hist - 1) * cd..].copy_from_slice(raw);
        }
    }
}

/// Per-head L2 norm of q and k in every row (q also scaled by `1/sqrt(d_k)`), in place; rows
/// split across the pool.
pub fn qk_norm(pool: &ThreadPool, d: &GdnDims, x: &mut [f32]) {
    let cd = d.conv_dim();
    let norm_rows = |x: &mut [f32]| {
        let scale = 1.0 / (d.dk as f32).sqrt();
        for row in x.chunks_exact_mut(cd) {
            let (qk, _) = row.split_at_mut(2 * d.key_dim());
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
    };
    pool.split_rows(x, cd, 1, SPLIT_MIN_ROWS, |part, _| norm_rows(part));
}

/// `x ← rmsnorm(x) · w · silu(z)` row by row (rows of `w.len()`), split across the pool.
pub fn gated_rms_norm(pool: &ThreadPool, x: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let dv = w.len();
    pool.split_rows(x, dv, 8, 1, |xs, rows| {
        for (o, zr) in xs.chunks_exact_mut(dv).zip(z[rows.start * dv..].chunks_exact(dv)) {
            let ss: f32 = o.iter().map(|x| x * x).sum();
            let inv = 1.0 / (ss / dv as f32 + eps).sqrt();
            for ((ov, &wv), &zv) in o.iter_mut().zip(w).zip(zr) {
                *ov = *ov * inv * wv * silu_scalar(zv);
            }
        }
    });
}

/// A sequence's rows and, for a draft tree, its parents.
type SeqPlan<'a> = (std::ops::Range<usize>, Option<&'a [Option<usize>]>);

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: tasks write disjoint ranges (see `delta_rule_heads`, `gated_rms_norm`).
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

/// The delta rule of every (sequence, value head), split across the pool (see
/// `Ops::delta_rule`).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_heads(
    pool: &ThreadPool,
    d: &GdnDims,
    mode: GdnMode,
    x: &[f32],
    beta: &[f32],
    g: &[f32],
    seqs: &mut [GdnSeq<'_, Vec<f32>>],
    out: &mut [f32],
) {
    let hv = d.hv;
    let tasks: Vec<(usize, usize)> = (0..seqs.len()).flat_map(|si| (0..hv).map(move |j| (si, j))).collect();
    let ssm: Vec<SyncPtr> = seqs.iter_mut().map(|s| SyncPtr(s.state.ssm.as_mut_ptr())).collect();
    // Tree sequences: every node's own state (the sequence's state stays the root's input).
    let node_ssm: Vec<Vec<SyncPtr>> = seqs
        .iter_mut()
        .map(|s| {
            s.tree.as_mut().map_or(Vec::new(), |t| {
                t.nodes
                    .iter_mut()
                    .map(|st| {
                        st.ssm.resize(d.ssm_state_len(), 0.0);
                        SyncPtr(st.ssm.as_mut_ptr())
                    })
                    .collect()
            })
        })
        .collect();
    let plan: Vec<SeqPlan> = seqs.iter().map(|s| (s.rows.clone(), s.tree.as_ref().map(|t| t.parents))).collect();
    let ctx = HeadCtx { d: *d, x, beta, g, o: SyncPtr(out.as_mut_ptr()) };
    pool.run(|ti, nt| {
        for &(si, j) in &tasks[split_range(tasks.len(), nt, ti, 1)] {
            let (rows, tree) = &plan[si];
            // SAFETY: each (sequence, head) task owns head j's state block and head j's
            // output columns of its sequence's rows; no two tasks share either.
            unsafe {
                let st = std::slice::from_raw_parts_mut(ssm[si].0.add(j * d.dk * d.dv), d.dk * d.dv);
                if let Some(parents) = tree {
                    ctx.tree_head(rows.clone(), parents, j, st, &node_ssm[si]);
                } else if mode == GdnMode::Chunked && rows.len() > 1 {
                    ctx.chunked_head(rows.clone(), j, st);
                } else {
                    ctx.recurrent_head(rows.clone(), j, st);
                }
            }
        }
    });
}

/// What every (sequence, head) task reads; `o` is written at disjoint ranges.
struct HeadCtx<'a> {
    d: GdnDims,
    x: &'a [f32],
    beta: &'a [f32],
    g: &'a [f32],
    o: SyncPtr,
}

impl HeadCtx<'_> {
    fn q(&self, row: usize, j: usize) -> &[f32] {
        let d = &self.d;
        let kh = j / (d.hv / d.hk);
        &self.x[row * d.conv_dim() + kh * d.dk..][..d.dk]
    }
    fn k(&self, row: usize, j: usize) -> &[f32] {
        let d = &self.d;
        let kh = j / (d.hv / d.hk);
        &self.x[row * d.conv_dim() + d.key_dim() + kh * d.dk..][..d.dk]
    }
    fn v(&self, row: usize, j: usize) -> &[f32] {
        let d = &self.d;
        &self.x[row * d.conv_dim() + 2 * d.key_dim() + j * d.dv..][..d.dv]
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

    /// Token-by-token delta rule for head `j` over `rows`.
    unsafe fn recurrent_head(&self, rows: std::ops::Range<usize>, j: usize, st: &mut [f32]) {
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
    unsafe fn tree_head(
        &self,
        rows: std::ops::Range<usize>,
        parents: &[Option<usize>],
        j: usize,
        root: &[f32],
        nodes: &[SyncPtr],
    ) {
        let block = self.d.dk * self.d.dv;
        for (t, parent) in parents.iter().enumerate().take(rows.len()) {
            // SAFETY: head j's block of node t (written here) and of its parent (< t, done).
            unsafe {
                let st = std::slice::from_raw_parts_mut(nodes[t].0.add(j * block), block);
                match *parent {
                    Some(p) => st.copy_from_slice(std::slice::from_raw_parts(nodes[p].0.add(j * block), block)),
                    None => st.copy_from_slice(root),
                }
                let row = rows.start + t;
                delta_rule(st, self.d.dk, self.d.dv, &[self.token(row, j)], &mut [self.o(row, j)]);
            }
        }
    }

    /// Chunked (WY) form of the same recurrence for head `j` (spec §3.4, "Chunked form").
    unsafe fn chunked_head(&self, rows: std::ops::Range<usize>, j: usize, st: &mut [f32]) {
        let (dk, dv, hv) = (self.d.dk, self.d.dv, self.d.hv);
        const CHUNK: usize = GDN_CHUNK;
        let mut gam = vec![0.0f32; CHUNK];
        let mut amat = vec![0.0f32; CHUNK * CHUNK];
        let mut u = vec![0.0f32; CHUNK * dv];
        let mut w = vec![0.0f32; CHUNK * dk];
        let mut qs = vec![0.0f32; dv];
        let (r0, m) = (rows.start, rows.len());
        let mut t0 = 0;
        while t0 < m {
            let c = CHUNK.min(m - t0);
            let row = |i: usize| r0 + t0 + i;
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
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}
