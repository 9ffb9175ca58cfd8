//! Paged KV writes and causal GQA attention over f16 or FP8 E4M3 KV pages ([`KvLayout`]).
//!
//! FP8 pages ([`KvDtype::Fp8`]): [`write_kv_scaled`] stores E4M3(x / scale) (spec 8.3); reads
//! decode each canonical chunk's rows into f16 scratch first. Every E4M3 value is exactly an
//! f16 value, so the f16 kernels then compute exactly on the E4M3 values, and the contract
//! below holds for FP8 pages as it does for f16 (decoding depends on the stored bytes only).
//! The scales are not applied by the reader: callers fold `k_scale` into
//! [`AttnParams::scale`] and multiply the output by `v_scale` (exact for the usual 1.0).
//!
//! Contract: the output for query head h at position p is a function of its q row, the KV of
//! positions 0..=p, the page size and the kernel set only, bit for bit: not of how many queries
//! run together, where the call starts, the thread count or which kernel ran it. So a prompt
//! served on top of cached KV (written by any chunking, or by decode steps) gives exactly the
//! output of a one-shot prefill. The canonical order for one query row:
//! - keys are cut at fixed positions into segments of [`SEGMENT`] keys, and segments into
//!   chunks of <= [`CHUNK`] keys that end at multiples of 16 and at page ends;
//! - within a segment the chunks fold in order into an online-softmax state (m, l, acc), one
//!   update per chunk whose per-row arithmetic every kernel of a set reproduces exactly
//!   (dot-product tree over head_dim, exp, sum tree over the chunk's keys, PV in key order);
//! - segment states merge in order by log-sum-exp ([`merge_weights`]), then `acc * (1 / l)`.
//!
//! Draft trees ([`attention_tree`], [`TreeKeys`]): a tree node's query follows the same
//! canonical order over its *logical* keys (committed positions, then its ancestors), so it
//! gets bitwise the output of a chain query at its position over its root path.
//!
//! Different kernel sets (AVX-512, AVX2, NEON, scalar) give different bits; KV is only
//! reusable bit-exactly by a process on the same kernel set ([`super::isa_name`]).
//!
//! Work unit: (block of consecutive queries, KV head[, segment]). The chunks every query of a
//! block sees fully are folded for all the block's rows at once (queries stacked as extra heads:
//! each K/V row is loaded once per block), with a "wide" rows-in-lanes kernel for whole
//! vectors of rows when the kernel set has one ([`query_blocks`]); the rest (the causal
//! diagonal, from the last shared chunk boundary on) runs per query. With few units (decode) segments run on
//! different threads and are merged afterwards, in the same order.
//! Cost: reads every visible K/V byte once per (query block, KV head).

use super::quant::{f16_to_f32, f32_to_f16};
use super::threadpool::ThreadPool;
use crate::pages::PageAddr;
use engine_ops::kv::{KvDtype, KvLayout, KvPart};

#[path = "attention_fp8.rs"]
mod fp8kv;
#[path = "attention_kv.rs"]
mod kv;
#[path = "attention_split.rs"]
mod split;
#[path = "attention_tree.rs"]
pub mod tree;
use fp8kv::decode_fp8_rows;
#[cfg(test)]
use fp8kv::e4m3_f16_table;
pub use kv::{write_kv, write_kv_scaled};
use split::{MergeShape, QueryBlock, merge_splits, query_blocks};
pub use tree::TreeKeys;

/// Runs `$group::<G>(c, st, h0)` over a chunk's stacked rows in groups of up to 4 (`G` = 4
/// while at least 4 rows are left): the chunk kernels that keep 4 rows' accumulators in
/// registers.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(unused_macros))]
macro_rules! in_groups_of_four {
    ($c:expr, $st:expr, $group:ident) => {{
        let (c, st) = ($c, $st);
        let mut h0 = 0;
        while h0 < c.g {
            let g = (c.g - h0).min(4);
            match g {
                4 => $group::<4>(c, st, h0),
                3 => $group::<3>(c, st, h0),
                2 => $group::<2>(c, st, h0),
                _ => $group::<1>(c, st, h0),
            }
            h0 += g;
        }
    }};
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) use in_groups_of_four;

/// Keys per chunk (one 512-bit f32 vector of scores).
pub const CHUNK: usize = 16;
/// Keys per segment: the fixed positions where a query's keys may be split across threads.
pub const SEGMENT: usize = 512;
/// Query heads (GQA group x stacked queries) one chunk call handles; the SIMD kernels keep
/// this many accumulators in registers.
const MAX_STACKED_HEADS: usize = 8;
/// Stacked rows for the wide (rows-in-lanes) kernel.
const MAX_WIDE_ROWS: usize = 128;
/// Rows in one vector of the wide kernel: it costs the same for 1 to 16 rows.
const WIDE_LANES: usize = 16;
/// Rows left over after whole vectors that still go to the wide kernel (one more vector);
/// up to this many run as one block on the stacked kernel instead.
const WIDE_TAIL_ROWS: usize = MAX_STACKED_HEADS;
/// Segments of a query go to separate units (merged afterwards) while there are fewer
/// (query block, KV head) units than this per thread: with 3 KV heads on 2 threads, whole
/// units leave one thread idle for a third of the call.
const MIN_UNITS_PER_THREAD: usize = 8;

pub struct AttnParams {
    pub layer: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Up to [`CHUNK`] contiguous keys of one page and `g` stacked query rows (heads of a GQA
/// group, possibly of several queries); each row's arithmetic is independent of the others.
pub(crate) struct Chunk<'a> {
    pub k: *const u16,
    pub v: *const u16,
    pub n: usize,
    pub head_dim: usize,
    /// `[g][head_dim]`, already multiplied by the softmax scale.
    pub q: &'a [f32],
    pub g: usize,
}

/// Running softmax state of the `g` heads of one unit.
pub(crate) struct State {
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    /// `[g][head_dim]`, unnormalized.
    pub acc: Vec<f32>,
    /// Reference kernel's f32 copy of a chunk (`2 * CHUNK * head_dim`).
    pub scratch: Vec<f32>,
}

impl State {
    fn new(g: usize, hd: usize) -> State {
        State {
            m: vec![f32::NEG_INFINITY; g],
            l: vec![0.0; g],
            acc: vec![0.0; g * hd],
            scratch: vec![0.0; 2 * CHUNK * hd],
        }
    }
    fn reset(&mut self) {
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.acc.fill(0.0);
    }
}

/// Reference chunk kernel.
pub(crate) unsafe fn chunk_scalar(c: &Chunk, st: &mut State) {
    let hd = c.head_dim;
    let (kf, vf) = st.scratch.split_at_mut(CHUNK * hd);
    // SAFETY: the chunk's rows are valid for `n * head_dim` reads (see `walk_keys`).
    let (ks, vs) = unsafe { (std::slice::from_raw_parts(c.k, c.n * hd), std::slice::from_raw_parts(c.v, c.n * hd)) };
    for i in 0..c.n * hd {
        kf[i] = f16_to_f32(ks[i]);
        vf[i] = f16_to_f32(vs[i]);
    }
    let mut s = [0f32; CHUNK];
    for h in 0..c.g {
        let q = &c.q[h * hd..(h + 1) * hd];
        for t in 0..c.n {
            s[t] = super::matmul::dot_f32_scalar(q, &kf[t * hd..(t + 1) * hd]);
        }
        let mx = s[..c.n].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let m_new = st.m[h].max(mx);
        let alpha = (st.m[h] - m_new).exp();
        let acc = &mut st.acc[h * hd..(h + 1) * hd];
        acc.iter_mut().for_each(|a| *a *= alpha);
        let mut l = st.l[h] * alpha;
        for t in 0..c.n {
            let p = (s[t] - m_new).exp();
            l += p;
            for (a, &v) in acc.iter_mut().zip(&vf[t * hd..(t + 1) * hd]) {
                *a += p * v;
            }
        }
        st.l[h] = l;
        st.m[h] = m_new;
    }
}

/// One run of <= [`CHUNK`] contiguous key rows (K and V) of one page.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))] // used by the SIMD kernels only
#[derive(Clone, Copy)]
pub(crate) struct ChunkRef {
    pub k: *const u16,
    pub v: *const u16,
    pub n: usize,
}

#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))] // used by the SIMD kernels only
impl ChunkRef {
    /// Prefetches the chunk's f16 K and V rows (`head_dim` values each): chunks live in
    /// scattered pages, so the wide kernels fetch the next one while this one computes.
    #[inline(always)]
    pub(crate) fn prefetch(&self, head_dim: usize) {
        for off in (0..self.n * head_dim * 2).step_by(64) {
            super::prefetch_l1((self.k as *const u8).wrapping_add(off));
            super::prefetch_l1((self.v as *const u8).wrapping_add(off));
        }
    }
}

/// Kernel folding many stacked query rows over a list of key chunks into a [`WideState`]:
/// `(chunks, qt, lane_blocks, head_dim, state)`, `qt` from [`transpose_rows`] (pre-scaled q).
/// Used for whole vectors of rows ([`query_blocks`]).
pub(crate) type WideFn = unsafe fn(&[ChunkRef], &[f32], usize, usize, &mut WideState);

/// Running softmax state of stacked rows with 16 rows per vector: row r is lane r % 16 of
/// lane block r / 16. Kept transposed across a unit's segments so the wide kernel does not
/// transpose per call.
pub(crate) struct WideState {
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    /// `[lane block][head_dim][16]`, unnormalized.
    pub acc: Vec<f32>,
}

impl WideState {
    pub(crate) fn new(rows: usize, hd: usize) -> WideState {
        let lanes = rows.div_ceil(16) * 16;
        WideState { m: vec![0.0; lanes], l: vec![0.0; lanes], acc: vec![0.0; lanes * hd] }
    }
    /// Empty state for `rows` rows; padding lanes get a finite max so they never make NaN.
    pub(crate) fn reset(&mut self, rows: usize) {
        self.m.fill(0.0);
        self.m[..rows].fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.acc.fill(0.0);
    }
    fn at(r: usize, d: usize, hd: usize) -> usize {
        ((r / 16) * hd + d) * 16 + r % 16
    }
    /// Copies rows r0..r0+st.m.len() into `st` (row-major).
    pub(crate) fn get_rows(&self, r0: usize, hd: usize, st: &mut State) {
        for (j, r) in (r0..r0 + st.m.len()).enumerate() {
            st.m[j] = self.m[r];
            st.l[j] = self.l[r];
            for d in 0..hd {
                st.acc[j * hd + d] = self.acc[Self::at(r, d, hd)];
            }
        }
    }
    /// The inverse of [`WideState::get_rows`].
    pub(crate) fn set_rows(&mut self, r0: usize, hd: usize, st: &State) {
        for (j, r) in (r0..r0 + st.m.len()).enumerate() {
            self.m[r] = st.m[j];
            self.l[r] = st.l[j];
            for d in 0..hd {
                self.acc[Self::at(r, d, hd)] = st.acc[j * hd + d];
            }
        }
    }
}

/// `rows` rows of `hd` values -> `[lane block][hd][16]` (padding lanes zero).
pub(crate) fn transpose_rows(src: &[f32], rows: usize, hd: usize, dst: &mut Vec<f32>) {
    dst.clear();
    dst.resize(rows.div_ceil(16) * 16 * hd, 0.0);
    for r in 0..rows {
        for d in 0..hd {
            dst[WideState::at(r, d, hd)] = src[r * hd + d];
        }
    }
}

/// End of the canonical chunk that starts at key `k`: the next multiple of [`CHUNK`] or of
/// the page size, whichever comes first (so chunk boundaries depend on positions only).
pub(crate) fn chunk_end(k: usize, page_tokens: usize) -> usize {
    ((k / CHUNK + 1) * CHUNK).min((k / page_tokens + 1) * page_tokens)
}

/// The K and V rows `t..t+n` of one page's blocks at `koff`/`voff`, as f16: in place for f16
/// pages, decoded into `dec` (at least `2 * n * hd` long) for FP8 pages.
///
/// # Safety
/// Rows `t..t+n` must lie inside the page's blocks.
#[inline]
unsafe fn chunk_rows(
    layout: &KvLayout,
    base: *const u8,
    koff: usize,
    voff: usize,
    t: usize,
    n: usize,
    dec: &mut [u16],
) -> (*const u16, *const u16) {
    let hd = layout.head_dim;
    // SAFETY: per the function contract.
    unsafe {
        match layout.dtype {
            KvDtype::F16 => (base.add(koff + t * hd * 2) as *const u16, base.add(voff + t * hd * 2) as *const u16),
            KvDtype::Fp8 => {
                let (kd, vd) = dec.split_at_mut(n * hd);
                decode_fp8_rows(base.add(koff + t * hd), n, hd, kd);
                decode_fp8_rows(base.add(voff + t * hd), n, hd, vd);
                (kd.as_ptr(), vd.as_ptr())
            }
        }
    }
}

/// The last canonical chunk boundary at or below `x`.
fn boundary_at_or_below(x: usize, page_tokens: usize) -> usize {
    (x / CHUNK * CHUNK).max(x / page_tokens * page_tokens)
}

/// Canonical chunks of keys `keys` (which start at a chunk boundary) of KV head `kvh`, in order.
/// FP8 rows are decoded into `dec` (resized here; the chunks point into it).
fn collect_chunks(
    layout: &KvLayout,
    pages: &[PageAddr],
    layer: usize,
    kvh: usize,
    keys: std::ops::Range<usize>,
    out: &mut Vec<ChunkRef>,
    dec: &mut Vec<u16>,
) {
    out.clear();
    let hd = layout.head_dim;
    if layout.dtype == KvDtype::Fp8 {
        // Sized once up front: the chunk pointers must stay valid while `out` is used.
        dec.resize(2 * keys.len() * hd, 0);
    }
    let mut used = 0;
    let pt = layout.page_tokens;
    let koff = layout.block_offset_bytes(layer, KvPart::Key, kvh);
    let voff = layout.block_offset_bytes(layer, KvPart::Value, kvh);
    let mut k = keys.start;
    while k < keys.end {
        let (p, t) = (k / pt, k % pt);
        let n = chunk_end(k, pt).min(keys.end) - k;
        let base = pages[p].as_ptr();
        let scratch: &mut [u16] =
            if layout.dtype == KvDtype::Fp8 { &mut dec[used..used + 2 * n * hd] } else { &mut [] };
        used += 2 * n * hd;
        // SAFETY: as in `walk_keys`.
        let (kp, vp) = unsafe { chunk_rows(layout, base, koff, voff, t, n, scratch) };
        out.push(ChunkRef { k: kp, v: vp, n });
        k += n;
    }
}

/// Folds keys `keys` (which start at a chunk boundary) of KV head `kvh` into `st`, chunk by
/// canonical chunk. `dec`: scratch for decoded FP8 rows.
#[allow(clippy::too_many_arguments)]
fn walk_keys(
    chunk_fn: unsafe fn(&Chunk, &mut State),
    layout: &KvLayout,
    pages: &[PageAddr],
    layer: usize,
    kvh: usize,
    keys: std::ops::Range<usize>,
    q: &[f32],
    g: usize,
    st: &mut State,
    dec: &mut Vec<u16>,
) {
    let hd = layout.head_dim;
    let pt = layout.page_tokens;
    if layout.dtype == KvDtype::Fp8 {
        dec.resize(2 * CHUNK * hd, 0);
    }
    let koff = layout.block_offset_bytes(layer, KvPart::Key, kvh);
    let voff = layout.block_offset_bytes(layer, KvPart::Value, kvh);
    let mut k = keys.start;
    while k < keys.end {
        let (p, t) = (k / pt, k % pt);
        let n = chunk_end(k, pt).min(keys.end) - k;
        let base = pages[p].as_ptr();
        if t == 0 {
            prefetch_page(layout, pages.get(p + 1).copied(), koff, voff);
        }
        // SAFETY: positions < keys.end are covered by `pages` (checked by the caller), and
        // rows t..t+n lie inside the page's [page_tokens][head_dim] blocks.
        unsafe {
            let (kp, vp) = chunk_rows(layout, base, koff, voff, t, n, dec);
            let c = Chunk { k: kp, v: vp, n, head_dim: hd, q, g };
            chunk_fn(&c, st);
        }
        k += n;
    }
}

/// Prefetches the next page's K and V blocks: pages are scattered, so the hardware stream
/// prefetcher cannot run ahead across a page boundary.
#[inline]
fn prefetch_page(layout: &KvLayout, page: Option<PageAddr>, koff: usize, voff: usize) {
    if let Some(page) = page {
        for off in (0..layout.head_block_bytes()).step_by(64) {
            // The addresses lie inside the page (a prefetch would not fault anyway).
            super::prefetch_l1(page.as_ptr().wrapping_add(koff + off));
            super::prefetch_l1(page.as_ptr().wrapping_add(voff + off));
        }
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: units write disjoint slices.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Log-sum-exp weights for folding one segment's `(m, l)` into a running total `(tm, tl)`,
/// which it updates; the accumulators then become `t * a + x * b` elementwise. Every path
/// merges a query's segments with this, in segment order, from an empty total (`m = -inf,
/// l = 0, acc = 0`); an empty segment (`m = -inf`) gives `None` and changes nothing.
#[inline(never)]
fn merge_weights(tm: &mut f32, tl: &mut f32, m: f32, l: f32) -> Option<(f32, f32)> {
    if m == f32::NEG_INFINITY {
        return None;
    }
    let mn = tm.max(m);
    // exp(0) is exactly 1: skipping that call changes no bit
    let a = if *tm == f32::NEG_INFINITY {
        0.0
    } else if *tm == mn {
        1.0
    } else {
        (*tm - mn).exp()
    };
    let b = if m == mn { 1.0 } else { (m - mn).exp() };
    *tl = *tl * a + l * b;
    *tm = mn;
    Some((a, b))
}

/// [`merge_weights`] for row-major accumulators.
fn merge_row(tm: &mut f32, tl: &mut f32, tacc: &mut [f32], m: f32, l: f32, acc: &[f32]) {
    if let Some((a, b)) = merge_weights(tm, tl, m, l) {
        for (t, &x) in tacc.iter_mut().zip(acc) {
            *t = *t * a + x * b;
        }
    }
}

/// The factor that normalizes a merged total: outputs are `acc * inv_sum(l)`.
fn inv_sum(l: f32) -> f32 {
    if l > 0.0 { 1.0 / l } else { 0.0 }
}

/// Causal GQA attention of n_q query rows at positions start_pos..start_pos+n_q over the KV in `pages`
/// (query i sees keys 0..=start_pos+i; their KV must already be written). q and out: [n_q][n_heads*head_dim].
/// Query head h uses KV head h / (n_heads / n_kv_heads). Softmax in f32. Bit-exact per query
/// (see the module contract).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    layout: &KvLayout,
    pages: &[PageAddr],
    p: &AttnParams,
    start_pos: usize,
    q: &[f32],
    n_q: usize,
    out: &mut [f32],
) {
    attention_with(super::dispatch(), pool, layout, pages, p, start_pos, None, q, n_q, out)
}

/// Draft-tree attention (verification): query `j` is tree node `j` at logical position
/// `start_pos + depth(j)`, with its KV in slot `start_pos + j` (already written), and sees
/// positions `[0, start_pos)` plus its ancestors. Its output is bitwise the output a chain
/// query at that position gets over the same keys in logical order (see [`TreeKeys`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_tree(
    pool: &ThreadPool,
    layout: &KvLayout,
    pages: &[PageAddr],
    p: &AttnParams,
    start_pos: usize,
    tree: &TreeKeys,
    q: &[f32],
    out: &mut [f32],
) {
    attention_with(super::dispatch(), pool, layout, pages, p, start_pos, Some(tree), q, tree.len(), out)
}

/// What one unit computes: a block of queries, one KV head, a run of segments.
struct Unit {
    /// Query rows i0..i1 of the call.
    i0: usize,
    i1: usize,
    kvh: usize,
    /// Whether its stacked rows run on the wide kernel.
    wide: bool,
}

/// Per-thread buffers of [`attention_with`].
struct Work {
    /// The current segment's state of every stacked row (chunk-kernel units).
    st: State,
    /// The same for wide-kernel units, and their merged total.
    wt: WideState,
    wtot: WideState,
    /// Per-row merge weights of [`merge_wide`].
    wa: Vec<f32>,
    wb: Vec<f32>,
    on: Vec<bool>,
    /// One query's rows while its diagonal keys run.
    sub: State,
    /// Stacked query rows, pre-scaled; `qt`: the same transposed for the wide kernel.
    qs: Vec<f32>,
    qt: Vec<f32>,
    chunks: Vec<ChunkRef>,
    /// Tree queries' ancestor K/V rows, copied into logical order.
    gather: Vec<u16>,
    /// FP8 K/V rows decoded to f16.
    dec: Vec<u16>,
}

/// Shape of one call, shared by all units.
struct Call<'a> {
    kern: &'a super::Dispatch,
    layout: &'a KvLayout,
    pages: &'a [PageAddr],
    layer: usize,
    g: usize,
    hd: usize,
    start_pos: usize,
    wide: Option<WideFn>,
    tree: Option<&'a TreeKeys>,
}

impl Call<'_> {
    /// Logical position of query row `i`.
    fn pos(&self, i: usize) -> usize {
        match self.tree {
            Some(t) => self.start_pos + t.depth(i),
            None => self.start_pos + i,
        }
    }

    /// Whether the unit's stacked rows run on the wide kernel (state in `w.wt`, else `w.st`).
    fn is_wide(&self, u: &Unit) -> bool {
        self.wide.is_some() && u.wide
    }

    /// Folds segment `seg` of the unit's keys into the unit's segment state (reset first): the
    /// keys before the block's last shared chunk boundary for all stacked rows at once, the
    /// rest per query. Wide units need `w.qt` filled.
    fn segment(&self, u: &Unit, seg: usize, w: &mut Work) {
        let (g, hd) = (self.g, self.hd);
        let gs = (u.i1 - u.i0) * g;
        let wide = self.is_wide(u);
        let (lo, hi) = (seg * SEGMENT, (seg + 1) * SEGMENT);
        // Keys every row of the block sees in place: a chain's up to its first query, a
        // tree's up to its root (every node's ancestor, and stored at its own position).
        let shared_to = if self.tree.is_some() { self.start_pos + 1 } else { self.start_pos + u.i0 + 1 };
        let shared_end = boundary_at_or_below(shared_to, self.layout.page_tokens);
        if wide {
            w.wt.reset(gs);
        } else {
            w.st.reset();
        }
        if lo < shared_end {
            let keys = lo..hi.min(shared_end);
            match self.wide {
                Some(wide_fn) if wide => {
                    collect_chunks(self.layout, self.pages, self.layer, u.kvh, keys, &mut w.chunks, &mut w.dec);
                    // SAFETY: the chunks point into pages covering these keys (checked by the caller).
                    unsafe { wide_fn(&w.chunks, &w.qt, gs.div_ceil(16), hd, &mut w.wt) };
                }
                _ => {
                    let qs = &w.qs[..gs * hd];
                    walk_keys(
                        self.kern.attn_chunk,
                        self.layout,
                        self.pages,
                        self.layer,
                        u.kvh,
                        keys,
                        qs,
                        gs,
                        &mut w.st,
                        &mut w.dec,
                    )
                }
            }
        }
        for i in u.i0..u.i1 {
            let keys = lo.max(shared_end)..hi.min(self.pos(i) + 1);
            if keys.is_empty() {
                continue;
            }
            let h0 = (i - u.i0) * g;
            let (st, sub) = (&mut w.st, &mut w.sub);
            if wide {
                w.wt.get_rows(h0, hd, sub);
            } else {
                sub.m.copy_from_slice(&st.m[h0..h0 + g]);
                sub.l.copy_from_slice(&st.l[h0..h0 + g]);
                sub.acc.copy_from_slice(&st.acc[h0 * hd..(h0 + g) * hd]);
            }
            let qi = &w.qs[h0 * hd..(h0 + g) * hd];
            match self.tree {
                Some(t) => {
                    let kv = tree::KvSource { layout: self.layout, pages: self.pages, layer: self.layer, kvh: u.kvh };
                    let slot = |x: usize| t.slot(self.start_pos, i, x);
                    tree::walk_gathered(self.kern.attn_chunk, &kv, keys, slot, qi, g, sub, &mut w.gather);
                }
                None => {
                    let (kern, layout, pages) = (self.kern.attn_chunk, self.layout, self.pages);
                    walk_keys(kern, layout, pages, self.layer, u.kvh, keys, qi, g, sub, &mut w.dec)
                }
            }
            if wide {
                w.wt.set_rows(h0, hd, sub);
            } else {
                st.m[h0..h0 + g].copy_from_slice(&sub.m);
                st.l[h0..h0 + g].copy_from_slice(&sub.l);
                st.acc[h0 * hd..(h0 + g) * hd].copy_from_slice(&sub.acc);
            }
        }
    }
}

/// [`merge_row`] for every row of transposed states: the same weights and elementwise
/// `t * a + x * b`, laid out so the accumulator loop runs over contiguous lanes.
fn merge_wide(w: &mut Work, rows: usize, hd: usize) {
    let lanes = rows.div_ceil(16) * 16;
    for r in 0..rows {
        match merge_weights(&mut w.wtot.m[r], &mut w.wtot.l[r], w.wt.m[r], w.wt.l[r]) {
            Some((a, b)) => (w.wa[r], w.wb[r], w.on[r]) = (a, b, true),
            None => w.on[r] = false,
        }
    }
    w.on[rows..lanes].fill(false);
    for lb in 0..lanes / 16 {
        let (wa, wb, on) = (&w.wa[lb * 16..][..16], &w.wb[lb * 16..][..16], &w.on[lb * 16..][..16]);
        for d in 0..hd {
            let o = (lb * hd + d) * 16;
            let (t, x) = (&mut w.wtot.acc[o..o + 16], &w.wt.acc[o..o + 16]);
            for i in 0..16 {
                let v = t[i] * wa[i] + x[i] * wb[i];
                t[i] = if on[i] { v } else { t[i] };
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_with(
    kern: &super::Dispatch,
    pool: &ThreadPool,
    layout: &KvLayout,
    pages: &[PageAddr],
    p: &AttnParams,
    start_pos: usize,
    tree: Option<&TreeKeys>,
    q: &[f32],
    n_q: usize,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    assert!(p.n_kv_heads == layout.n_kv_heads && hd == layout.head_dim, "attention: params do not match the KV layout");
    assert!(
        p.n_kv_heads > 0 && p.n_heads.is_multiple_of(p.n_kv_heads),
        "attention: n_heads must be a multiple of n_kv_heads"
    );
    assert!(p.layer < layout.n_layers, "attention: layer out of range");
    let row = p.n_heads * hd;
    assert!(q.len() >= n_q * row && out.len() >= n_q * row, "attention: q/out shorter than n_q rows");
    assert!(pages.len() * layout.page_tokens >= start_pos + n_q, "attention: pages do not cover the positions");
    if n_q == 0 {
        return;
    }
    assert!(tree.is_none_or(|t| t.len() == n_q), "attention: tree size differs from the query count");
    let g = p.n_heads / p.n_kv_heads;
    let wide = kern.attn_wide.filter(|_| matches!(hd, 16 | 32 | 64 | 128 | 256));
    let blocks = query_blocks(n_q, g, wide.is_some());
    let n_blocks = blocks.len();
    let gmax = blocks.iter().map(|b| (b.i1 - b.i0) * g).max().unwrap_or(g);
    let nt = pool.n_threads();
    let base_units = n_blocks * p.n_kv_heads;
    // Segments go to separate units (and are merged afterwards) only when there are too few
    // (query block, head) units to spread evenly over the threads; the arithmetic is the same.
    let last_pos = |i0: usize, i1: usize| match tree {
        Some(t) => start_pos + (i0..i1).map(|i| t.depth(i)).max().unwrap_or(0),
        None => start_pos + i1 - 1,
    };
    let n_segs = last_pos(0, n_q) / SEGMENT + 1;
    let splits = if base_units >= MIN_UNITS_PER_THREAD * nt { 1 } else { n_segs };
    let units = base_units * splits;
    let part_len = gmax * (hd + 2);
    let mut partials = vec![0f32; if splits > 1 { units * part_len } else { 0 }];
    let parts = SyncPtr(partials.as_mut_ptr());
    let outp = SyncPtr(out.as_mut_ptr());
    let call = Call { kern, layout, pages, layer: p.layer, g, hd, start_pos, wide, tree };
    pool.run(|ti, nt| {
        let lanes = gmax.div_ceil(16) * 16;
        let mut w = Work {
            st: State::new(gmax, hd),
            wt: WideState::new(gmax, hd),
            wtot: WideState::new(gmax, hd),
            wa: vec![0.0; lanes],
            wb: vec![0.0; lanes],
            on: vec![false; lanes],
            sub: State::new(g, hd),
            qs: vec![0f32; gmax * hd],
            qt: Vec::new(),
            chunks: Vec::new(),
            gather: Vec::new(),
            dec: Vec::new(),
        };
        let mut tot = State::new(gmax, hd);
        let mut ui = ti;
        while ui < units {
            let (b, rest) = (ui / (p.n_kv_heads * splits), ui % (p.n_kv_heads * splits));
            let (kvh, s) = (rest / splits, rest % splits);
            let QueryBlock { i0, i1, wide } = blocks[b];
            let u = Unit { i0, i1, kvh, wide };
            let gs = (u.i1 - u.i0) * g;
            for i in u.i0..u.i1 {
                let qrow = &q[i * row + kvh * g * hd..][..g * hd];
                let dst = &mut w.qs[(i - u.i0) * g * hd..][..g * hd];
                dst.iter_mut().zip(qrow).for_each(|(d, &x)| *d = x * p.scale);
            }
            let wide_unit = call.is_wide(&u);
            if wide_unit {
                transpose_rows(&w.qs[..gs * hd], gs, hd, &mut w.qt);
            }
            let block_segs = last_pos(u.i0, u.i1) / SEGMENT + 1;
            if splits == 1 {
                // SAFETY: each (query, head) output row is written by exactly one unit.
                let out_row = |hs: usize| unsafe {
                    let (i, h) = (u.i0 + hs / g, hs % g);
                    std::slice::from_raw_parts_mut(outp.get().add(i * row + (kvh * g + h) * hd), hd)
                };
                if wide_unit {
                    w.wtot.reset(gs);
                    for seg in 0..block_segs {
                        call.segment(&u, seg, &mut w);
                        merge_wide(&mut w, gs, hd);
                    }
                    for hs in 0..gs {
                        let inv = inv_sum(w.wtot.l[hs]);
                        for (d, o) in out_row(hs).iter_mut().enumerate() {
                            *o = w.wtot.acc[WideState::at(hs, d, hd)] * inv;
                        }
                    }
                } else {
                    tot.reset();
                    for seg in 0..block_segs {
                        call.segment(&u, seg, &mut w);
                        for hs in 0..gs {
                            let (st, acc) = (&w.st, &mut tot.acc[hs * hd..(hs + 1) * hd]);
                            merge_row(
                                &mut tot.m[hs],
                                &mut tot.l[hs],
                                acc,
                                st.m[hs],
                                st.l[hs],
                                &st.acc[hs * hd..(hs + 1) * hd],
                            );
                        }
                    }
                    for hs in 0..gs {
                        let inv = inv_sum(tot.l[hs]);
                        for (o, &a) in out_row(hs).iter_mut().zip(&tot.acc[hs * hd..(hs + 1) * hd]) {
                            *o = a * inv;
                        }
                    }
                }
            } else {
                if s < block_segs {
                    call.segment(&u, s, &mut w);
                    if wide_unit {
                        w.wt.get_rows(0, hd, &mut w.st);
                    }
                } else {
                    w.st.reset();
                }
                // SAFETY: unit ui owns partials[ui * part_len ..][..part_len].
                let dst = unsafe { std::slice::from_raw_parts_mut(parts.get().add(ui * part_len), part_len) };
                dst[..gmax].copy_from_slice(&w.st.m);
                dst[gmax..2 * gmax].copy_from_slice(&w.st.l);
                dst[2 * gmax..].copy_from_slice(&w.st.acc);
            }
            ui += nt;
        }
    });
    if splits > 1 {
        let shape = MergeShape { n_kv: p.n_kv_heads, splits, g, gmax, hd };
        merge_splits(&partials, &shape, &blocks, out);
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
