//! Paged KV writes and causal GQA attention over f16 KV pages ([`KvLayout`]).
//!
//! Work unit: (block of consecutive queries, KV head, key split). A unit walks its keys in
//! chunks of <= 16 contiguous rows of one page, handling all query heads of the GQA group and
//! of the query block together (up to 8 "stacked heads"), so each K and V row is loaded and
//! converted once per unit, with an online (running max) softmax in f32. With >= 16 stacked
//! rows (prefill chunks, verification) and a SIMD kernel that has one, a "wide" kernel takes
//! up to 64 rows with the rows in vector lanes (no horizontal sums; ~FMA-bound). The keys only
//! the later queries of a block see (the causal diagonal) run per query afterwards.
//! With few queries (decode) the keys are split across threads and the partial results are
//! merged with log-sum-exp; with many queries (prefill) units are whole key ranges.
//! Cost: reads every visible K/V byte once per (query block, KV head).

use super::quant::{f16_to_f32, f32_to_f16};
use super::threadpool::{split_range, ThreadPool};
use crate::memory::{KvLayout, KvPart, PagePtr};

/// Keys per chunk (one 512-bit f32 vector of scores).
pub const CHUNK: usize = 16;
/// Smallest key split worth a separate unit.
const MIN_SPLIT_KEYS: usize = 128;
/// Query heads (GQA group x stacked queries) one chunk call handles; the SIMD kernels keep
/// this many accumulators in registers.
const MAX_STACKED_HEADS: usize = 8;
/// Stacked rows for the wide (rows-in-lanes) kernel, and the fewest that make it pay.
const MAX_WIDE_ROWS: usize = 64;
pub(crate) const MIN_WIDE_ROWS: usize = 16;

/// Writes K and V rows (each n_kv_heads*head_dim f32, converted to f16) of position `pos` of `layer` into the pages.
pub fn write_kv(layout: &KvLayout, pages: &[PagePtr], layer: usize, pos: usize, k: &[f32], v: &[f32]) {
    let hd = layout.head_dim;
    let row = layout.n_kv_heads * hd;
    assert!(layer < layout.n_layers, "write_kv: layer {layer} out of range");
    assert!(k.len() >= row && v.len() >= row, "write_kv: k/v rows shorter than {row}");
    let page = *pages.get(pos / layout.page_tokens).expect("write_kv: no page for position");
    let t = pos % layout.page_tokens;
    for (part, src) in [(KvPart::Key, k), (KvPart::Value, v)] {
        for h in 0..layout.n_kv_heads {
            let off = layout.block_offset_bytes(layer, part, h) + t * hd * 2;
            // SAFETY: `off + 2*hd` lies inside the page (KvLayout arithmetic); the caller holds
            // the page's write lease.
            let dst = unsafe { std::slice::from_raw_parts_mut(page.as_ptr().add(off) as *mut u16, hd) };
            for (d, &x) in dst.iter_mut().zip(&src[h * hd..(h + 1) * hd]) {
                *d = f32_to_f16(x);
            }
        }
    }
}

pub struct AttnParams {
    pub layer: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// Up to [`CHUNK`] contiguous keys of one page and the query heads of one GQA group.
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
        State { m: vec![f32::NEG_INFINITY; g], l: vec![0.0; g], acc: vec![0.0; g * hd], scratch: vec![0.0; 2 * CHUNK * hd] }
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
#[derive(Clone, Copy)]
pub(crate) struct ChunkRef {
    pub k: *const u16,
    pub v: *const u16,
    pub n: usize,
}

/// Kernel folding many stacked query rows (`q`: `[rows][head_dim]`, pre-scaled) over a list of
/// key chunks into `st`; worth it from [`MIN_WIDE_ROWS`] rows on.
pub(crate) type WideFn = unsafe fn(&[ChunkRef], &[f32], usize, usize, &mut State);

/// Chunks of keys `keys` of KV head `kvh`, in order.
fn collect_chunks(layout: &KvLayout, pages: &[PagePtr], layer: usize, kvh: usize, keys: std::ops::Range<usize>, out: &mut Vec<ChunkRef>) {
    out.clear();
    let hd = layout.head_dim;
    let pt = layout.page_tokens;
    let koff = layout.block_offset_bytes(layer, KvPart::Key, kvh);
    let voff = layout.block_offset_bytes(layer, KvPart::Value, kvh);
    let mut k = keys.start;
    while k < keys.end {
        let (p, t) = (k / pt, k % pt);
        let n = (pt - t).min(CHUNK).min(keys.end - k);
        let base = pages[p].as_ptr();
        // SAFETY: as in `walk_keys`.
        unsafe { out.push(ChunkRef { k: base.add(koff + t * hd * 2) as *const u16, v: base.add(voff + t * hd * 2) as *const u16, n }) };
        k += n;
    }
}

/// Runs one unit's keys `keys` for KV head `kvh`, folding them into `st`.
#[allow(clippy::too_many_arguments)]
fn walk_keys(
    chunk_fn: unsafe fn(&Chunk, &mut State),
    layout: &KvLayout,
    pages: &[PagePtr],
    layer: usize,
    kvh: usize,
    keys: std::ops::Range<usize>,
    q: &[f32],
    g: usize,
    st: &mut State,
) {
    let hd = layout.head_dim;
    let pt = layout.page_tokens;
    let koff = layout.block_offset_bytes(layer, KvPart::Key, kvh);
    let voff = layout.block_offset_bytes(layer, KvPart::Value, kvh);
    let mut k = keys.start;
    while k < keys.end {
        let (p, t) = (k / pt, k % pt);
        let n = (pt - t).min(CHUNK).min(keys.end - k);
        let base = pages[p].as_ptr();
        if t == 0 {
            prefetch_page(layout, pages.get(p + 1).copied(), koff, voff);
        }
        // SAFETY: positions < keys.end are covered by `pages` (checked by the caller), and
        // rows t..t+n lie inside the page's [page_tokens][head_dim] blocks.
        unsafe {
            let c = Chunk {
                k: base.add(koff + t * hd * 2) as *const u16,
                v: base.add(voff + t * hd * 2) as *const u16,
                n,
                head_dim: hd,
                q,
                g,
            };
            chunk_fn(&c, st);
        }
        k += n;
    }
}

/// Prefetches the next page's K and V blocks: pages are scattered, so the hardware stream
/// prefetcher cannot run ahead across a page boundary.
#[inline]
fn prefetch_page(layout: &KvLayout, page: Option<PagePtr>, koff: usize, voff: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(page) = page {
        let bytes = layout.head_block_bytes();
        for off in (0..bytes).step_by(64) {
            // SAFETY: prefetch never faults; the addresses lie inside the page anyway.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(page.as_ptr().add(koff + off) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(page.as_ptr().add(voff + off) as *const i8);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (layout, page, koff, voff);
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

/// Causal GQA attention of n_q query rows at positions start_pos..start_pos+n_q over the KV in `pages`
/// (query i sees keys 0..=start_pos+i; their KV must already be written). q and out: [n_q][n_heads*head_dim].
/// Query head h uses KV head h / (n_heads / n_kv_heads). Softmax in f32.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    layout: &KvLayout,
    pages: &[PagePtr],
    p: &AttnParams,
    start_pos: usize,
    q: &[f32],
    n_q: usize,
    out: &mut [f32],
) {
    attention_with(super::dispatch(), pool, layout, pages, p, start_pos, q, n_q, out)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_with(
    kern: &super::Dispatch,
    pool: &ThreadPool,
    layout: &KvLayout,
    pages: &[PagePtr],
    p: &AttnParams,
    start_pos: usize,
    q: &[f32],
    n_q: usize,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    assert!(p.n_kv_heads == layout.n_kv_heads && hd == layout.head_dim, "attention: params do not match the KV layout");
    assert!(p.n_kv_heads > 0 && p.n_heads.is_multiple_of(p.n_kv_heads), "attention: n_heads must be a multiple of n_kv_heads");
    assert!(p.layer < layout.n_layers, "attention: layer out of range");
    let row = p.n_heads * hd;
    assert!(q.len() >= n_q * row && out.len() >= n_q * row, "attention: q/out shorter than n_q rows");
    assert!(pages.len() * layout.page_tokens >= start_pos + n_q, "attention: pages do not cover the positions");
    if n_q == 0 {
        return;
    }
    let g = p.n_heads / p.n_kv_heads;
    // Consecutive queries are stacked as extra heads of one unit, so every K/V row they all
    // see is loaded once for the block; the few keys only later queries see run per query.
    let wide = kern.attn_wide.filter(|_| matches!(hd, 16 | 32 | 64 | 128) && n_q * g >= MIN_WIDE_ROWS);
    let qb = ((if wide.is_some() { MAX_WIDE_ROWS } else { MAX_STACKED_HEADS }) / g).clamp(1, n_q);
    let n_blocks = n_q.div_ceil(qb);
    let gmax = qb * g;
    let nt = pool.n_threads();
    let base_units = n_blocks * p.n_kv_heads;
    let max_keys = start_pos + n_q;
    // Split keys only when there are too few (query block, head) units to keep every thread busy.
    let splits = if base_units >= 2 * nt { 1 } else { (2 * nt).div_ceil(base_units).min(max_keys.div_ceil(MIN_SPLIT_KEYS)).max(1) };
    let units = base_units * splits;
    let part_len = gmax * (hd + 2);
    let mut partials = vec![0f32; if splits > 1 { units * part_len } else { 0 }];
    let parts = SyncPtr(partials.as_mut_ptr());
    let outp = SyncPtr(out.as_mut_ptr());
    pool.run(|ti, nt| {
        let mut st = State::new(gmax, hd);
        let mut sub = State::new(g, hd);
        let mut qs = vec![0f32; gmax * hd];
        let mut chunks = Vec::new();
        let mut u = ti;
        while u < units {
            let (b, rest) = (u / (p.n_kv_heads * splits), u % (p.n_kv_heads * splits));
            let (kvh, s) = (rest / splits, rest % splits);
            let (i0, i1) = (b * qb, ((b + 1) * qb).min(n_q));
            let gs = (i1 - i0) * g;
            for i in i0..i1 {
                let qrow = &q[i * row + kvh * g * hd..][..g * hd];
                let dst = &mut qs[(i - i0) * g * hd..][..g * hd];
                dst.iter_mut().zip(qrow).for_each(|(d, &x)| *d = x * p.scale);
            }
            st.reset();
            let shared = start_pos + i0 + 1;
            let keys = split_range(shared, splits, s, CHUNK);
            match wide {
                Some(wide_fn) if gs >= MIN_WIDE_ROWS => {
                    collect_chunks(layout, pages, p.layer, kvh, keys, &mut chunks);
                    // SAFETY: the chunks point into pages covering these keys (checked above).
                    unsafe { wide_fn(&chunks, &qs[..gs * hd], gs, hd, &mut st) };
                }
                _ => walk_keys(kern.attn_chunk, layout, pages, p.layer, kvh, keys, &qs[..gs * hd], gs, &mut st),
            }
            if s == splits - 1 {
                for i in i0 + 1..i1 {
                    let h0 = (i - i0) * g;
                    sub.m.copy_from_slice(&st.m[h0..h0 + g]);
                    sub.l.copy_from_slice(&st.l[h0..h0 + g]);
                    sub.acc.copy_from_slice(&st.acc[h0 * hd..(h0 + g) * hd]);
                    let qi = &qs[h0 * hd..(h0 + g) * hd];
                    walk_keys(kern.attn_chunk, layout, pages, p.layer, kvh, shared..start_pos + i + 1, qi, g, &mut sub);
                    st.m[h0..h0 + g].copy_from_slice(&sub.m);
                    st.l[h0..h0 + g].copy_from_slice(&sub.l);
                    st.acc[h0 * hd..(h0 + g) * hd].copy_from_slice(&sub.acc);
                }
            }
            if splits == 1 {
                for hs in 0..gs {
                    let (i, h) = (i0 + hs / g, hs % g);
                    let inv = if st.l[hs] > 0.0 { 1.0 / st.l[hs] } else { 0.0 };
                    for d in 0..hd {
                        // SAFETY: each (query, head) output row is written by exactly one unit.
                        unsafe { *outp.get().add(i * row + (kvh * g + h) * hd + d) = st.acc[hs * hd + d] * inv };
                    }
                }
            } else {
                // SAFETY: unit u owns partials[u * part_len ..][..part_len].
                let dst = unsafe { std::slice::from_raw_parts_mut(parts.get().add(u * part_len), part_len) };
                dst[..gmax].copy_from_slice(&st.m);
                dst[gmax..2 * gmax].copy_from_slice(&st.l);
                dst[2 * gmax..].copy_from_slice(&st.acc);
            }
            u += nt;
        }
    });
    if splits > 1 {
        let shape = MergeShape { n_q, n_kv: p.n_kv_heads, splits, g, qb, hd };
        merge_splits(&partials, &shape, out);
    }
}

struct MergeShape {
    n_q: usize,
    n_kv: usize,
    splits: usize,
    g: usize,
    qb: usize,
    hd: usize,
}

/// Log-sum-exp merge of key-split partials into normalized outputs.
fn merge_splits(parts: &[f32], sh: &MergeShape, out: &mut [f32]) {
    let (g, hd, splits) = (sh.g, sh.hd, sh.splits);
    let gmax = sh.qb * g;
    let part_len = gmax * (hd + 2);
    let row = sh.n_kv * g * hd;
    for i in 0..sh.n_q {
        let (b, qi) = (i / sh.qb, i % sh.qb);
        for kvh in 0..sh.n_kv {
            let unit0 = (b * sh.n_kv + kvh) * splits;
            for h in 0..g {
                let hs = qi * g + h;
                let m = (0..splits).map(|s| parts[(unit0 + s) * part_len + hs]).fold(f32::NEG_INFINITY, f32::max);
                let dst = &mut out[i * row + (kvh * g + h) * hd..][..hd];
                dst.fill(0.0);
                let mut l = 0f32;
                for s in 0..splits {
                    let pp = &parts[(unit0 + s) * part_len..][..part_len];
                    if pp[hs] == f32::NEG_INFINITY {
                        continue;
                    }
                    let w = (pp[hs] - m).exp();
                    l += w * pp[gmax + hs];
                    for (o, &a) in dst.iter_mut().zip(&pp[2 * gmax + hs * hd..][..hd]) {
                        *o += w * a;
                    }
                }
                let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
                dst.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
