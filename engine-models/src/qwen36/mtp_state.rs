//! Per-sequence MTP drafting state of the Qwen3.5 / Qwen3.6 model (spec
//! tree-speculative-decoding §1.1–1.3, qwen36-architecture §5.2).
//!
//! Contract: while drafting is on, [`MtpStates::observe`] sees every forward pass together with
//! its rows' final hidden states (after `model.norm`), and [`MtpStates::accept_tree_path`] every
//! accepted draft-tree path, so for each sequence it knows the target hiddens of all committed
//! positions without the caller handing them over. The MTP layer's own KV (pages private to
//! this module, one layer, [`Qwen36Model::mtp_kv_layout`]) holds committed positions
//! `[0, kv_len)`; the hiddens and input tokens of positions `[kv_len, P)` (`P` = the target's
//! committed length) wait for their catch-up pair `(h[t], x[t+1])`, whose last token is the
//! root, known only when drafting. [`MtpStates::draft`] runs the catch-up (writing MTP KV of
//! committed positions, overwriting draft entries left there), then the greedy chain, and
//! returns each depth's top-k candidates with log-probabilities (DDTree, spec §1.3). Chain
//! steps write KV at positions `>= P` as scratch: `kv_len` never covers them and the next
//! catch-up rewrites them before any row reads them (a row attends only up to its own
//! position), so the MTP KV only ever keeps committed positions.
//!
//! A sequence whose passes this module missed (state restored from a snapshot, drafting turned
//! on mid-sequence) resynchronises with zeroed MTP KV for the missed positions: its drafts get
//! worse, never wrong (verification decides what is emitted). Long runs of pending rows (a
//! prompt) are caught up eagerly, so a sequence holds at most [`EAGER_ROWS`] pending hiddens.

use std::collections::HashMap;

use crate::EngineError;
use engine_ops::Ops;
use engine_ops::batch::{ForwardBatch, SeqInput};
use engine_ops::kv::{KvLayout, PageId};

use super::mtp::{MtpInput, MtpLogits, MtpOutput};
use super::{Qwen36Model, Qwen36Scratch};

/// Pending rows beyond which [`MtpStates::observe`] catches up right away.
pub const EAGER_ROWS: usize = 256;
/// Rows per MTP catch-up pass (bounds the scratch of a long prompt's catch-up).
const CATCH_UP_CHUNK: usize = 512;

/// Spare private pages kept for reuse beyond this many are given back to the backend.
const MAX_SPARE_PAGES: usize = 256;

/// Per-depth top-k draft candidates: `cands[d - 1]` lists `(token, log-prob)` for depth `d`,
/// best first (ties: smaller token id).
pub type MtpCandidates = Vec<Vec<(u32, f32)>>;

struct PendingTree {
    start_pos: usize,
    hidden: Vec<f32>,
    tokens: Vec<u32>,
}

#[derive(Default)]
struct MtpSeq {
    /// Private KV pages (the backend's, see [`Ops::private_pages`]).
    pages: Vec<PageId>,
    /// MTP KV holds committed positions `[0, kv_len)`.
    kv_len: usize,
    /// Target hiddens (`tokens.len()` rows) and input tokens of positions `kv_len..`.
    hidden: Vec<f32>,
    tokens: Vec<u32>,
    /// The last pass's draft tree (every node's hidden), until a path is accepted.
    tree: Option<PendingTree>,
}

impl MtpSeq {
    /// The target's committed length as this sequence knows it.
    fn committed(&self) -> usize {
        self.kv_len + self.tokens.len()
    }

    /// Pages for `positions`, spare ones first (zeroed, like fresh ones).
    fn ensure_pages<O: Ops>(
        &mut self,
        ops: &O,
        spare: &mut Vec<PageId>,
        layout: &KvLayout,
        positions: usize,
    ) -> Result<(), EngineError> {
        let need = positions.div_ceil(layout.page_tokens).saturating_sub(self.pages.len());
        if need == 0 {
            return Ok(());
        }
        let reused: Vec<PageId> = spare.drain(spare.len().saturating_sub(need)..).collect();
        ops.zero_private_pages(layout, &reused)?;
        let fresh = ops.private_pages(layout, need - reused.len())?;
        self.pages.extend(reused);
        self.pages.extend(fresh);
        Ok(())
    }

    /// Forgets what it knew and continues from `start_pos` with zeroed KV before it.
    fn resync<O: Ops>(
        &mut self,
        ops: &O,
        spare: &mut Vec<PageId>,
        layout: &KvLayout,
        start_pos: usize,
    ) -> Result<(), EngineError> {
        self.ensure_pages(ops, spare, layout, start_pos)?;
        ops.zero_private_pages(layout, &self.pages)?;
        self.kv_len = start_pos;
        self.hidden.clear();
        self.tokens.clear();
        self.tree = None;
        Ok(())
    }
}

/// MTP state of every sequence, keyed by `seq_id`.
pub struct MtpStates {
    enabled: bool,
    page_tokens: usize,
    map: HashMap<u64, MtpSeq>,
    /// Private pages of forgotten sequences, reused before new ones are asked for.
    spare: Vec<PageId>,
}

impl MtpStates {
    /// Drafting starts off: until [`MtpStates::set_enabled`], passes are not tracked.
    pub fn new(page_tokens: usize) -> MtpStates {
        MtpStates { enabled: false, page_tokens, map: HashMap::new(), spare: Vec::new() }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns tracking on or off (off forgets every sequence).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            let ids: Vec<u64> = self.map.keys().copied().collect();
            for id in ids {
                self.release(id);
            }
        }
    }

    /// Forgets the sequence; its pages are kept for the next one.
    pub fn release(&mut self, seq_id: u64) {
        if let Some(seq) = self.map.remove(&seq_id) {
            self.spare.extend(seq.pages);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The sequence's MTP KV pages and how many leading positions hold committed entries.
    pub fn kv(&self, seq_id: u64) -> Option<(&[PageId], usize)> {
        self.map.get(&seq_id).map(|s| (&s.pages[..], s.kv_len))
    }

    /// Records a forward pass: `hidden[i]` are the final hiddens of `batch.seqs[i]`'s rows.
    pub fn observe<O: Ops>(
        &mut self,
        model: &Qwen36Model<O>,
        ops: &O,
        s: &mut Qwen36Scratch<O>,
        batch: &ForwardBatch<'_>,
        hidden: &[Vec<f32>],
    ) -> Result<(), EngineError> {
        if !self.enabled || !model.has_mtp() {
            return Ok(());
        }
        let layout = model.mtp_kv_layout(self.page_tokens);
        if self.spare.len() > MAX_SPARE_PAGES {
            ops.free_private_pages(&self.spare.split_off(MAX_SPARE_PAGES));
        }
        for (q, hid) in batch.seqs.iter().zip(hidden) {
            let seq = self.map.entry(q.seq_id).or_default();
            record_pass(ops, &mut self.spare, seq, &layout, q, hid)?;
            if seq.tokens.len() > EAGER_ROWS {
                catch_up(model, ops, s, &layout, seq, &mut self.spare, None)?;
            }
        }
        Ok(())
    }

    /// The target kept the path `accepted` of its tree pass from `start_pos`: those nodes'
    /// hiddens become committed positions `start_pos..start_pos + accepted.len()`.
    pub fn accept_tree_path(&mut self, seq_id: u64, start_pos: usize, accepted: &[usize]) {
        let Some(seq) = self.map.get_mut(&seq_id) else { return };
        match seq.tree.take() {
            Some(t) if t.start_pos == start_pos && seq.committed() == start_pos && !t.tokens.is_empty() => {
                let h = t.hidden.len() / t.tokens.len();
                if accepted.iter().any(|&n| n >= t.tokens.len()) {
                    self.release(seq_id);
                    return;
                }
                for &n in accepted {
                    seq.hidden.extend_from_slice(&t.hidden[n * h..(n + 1) * h]);
                    seq.tokens.push(t.tokens[n]);
                }
            }
            // A path of a pass this module did not see: the next pass resynchronises.
            _ => self.release(seq_id),
        }
    }

    /// Drafts under `root`, the token at the target's committed length `target_pos`: the
    /// top-`top_k` candidates of each depth `1..=max_depth` along the MTP's greedy chain.
    /// The chain stops before a depth whose greedy path log-probability is below `min_score`
    /// (no node there could make the tree). `None` when this sequence cannot draft now
    /// (drafting off, no MTP module, a pass it missed); `max_depth == 0` only asks whether it
    /// can (`Some(empty)`).
    #[allow(clippy::too_many_arguments)]
    pub fn draft<O: Ops>(
        &mut self,
        model: &Qwen36Model<O>,
        ops: &O,
        s: &mut Qwen36Scratch<O>,
        seq_id: u64,
        target_pos: usize,
        root: u32,
        max_depth: usize,
        top_k: usize,
        min_score: f32,
    ) -> Result<Option<MtpCandidates>, EngineError> {
        if !self.enabled || !model.has_mtp() {
            return Ok(None);
        }
        let layout = model.mtp_kv_layout(self.page_tokens);
        let Some(seq) = self.map.get_mut(&seq_id) else { return Ok(None) };
        seq.tree = None;
        if seq.committed() != target_pos || seq.tokens.is_empty() {
            return Ok(None);
        }
        if max_depth == 0 || top_k == 0 {
            return Ok(Some(Vec::new()));
        }
        seq.ensure_pages(ops, &mut self.spare, &layout, target_pos + max_depth)?;
        let Some(first) = catch_up(model, ops, s, &layout, seq, &mut self.spare, Some(root))? else {
            return Ok(None);
        };
        let (h, vocab) = (model.hparams().hidden_size, model.hparams().vocab_size);
        let mut logits = first.logits;
        let mut hidden = first.hidden[first.hidden.len() - h..].to_vec();
        let mut out = Vec::with_capacity(max_depth);
        let mut greedy = 0.0f32;
        for d in 1..=max_depth {
            let cands = top_k_log_probs(&logits[..vocab], top_k);
            let Some(&(best, lp)) = cands.first() else { break };
            greedy += lp;
            if greedy < min_score {
                break;
            }
            out.push(cands);
            if d == max_depth {
                break;
            }
            // Depth d+1 from (g_d, argmax_d) at position P - 1 + d: scratch KV past P.
            let input = MtpInput { tokens: &[best], hidden: &hidden, start_pos: target_pos - 1 + d, pages: &seq.pages };
            let step = model.mtp_forward_with(ops, &layout, &input, None, s, MtpLogits::Last)?;
            logits = step.logits;
            hidden = step.hidden;
        }
        Ok(Some(out))
    }
}

/// Folds one pass of a sequence into its state.
fn record_pass<O: Ops>(
    ops: &O,
    spare: &mut Vec<PageId>,
    seq: &mut MtpSeq,
    layout: &KvLayout,
    q: &SeqInput<'_>,
    hid: &[f32],
) -> Result<(), EngineError> {
    if q.start_pos == 0 {
        seq.kv_len = 0;
        seq.hidden.clear();
        seq.tokens.clear();
    } else if q.start_pos != seq.committed() {
        seq.resync(ops, spare, layout, q.start_pos)?;
    }
    seq.tree = None;
    if q.tree.is_some() {
        seq.tree = Some(PendingTree { start_pos: q.start_pos, hidden: hid.to_vec(), tokens: q.tokens.to_vec() });
    } else {
        seq.hidden.extend_from_slice(hid);
        seq.tokens.extend_from_slice(q.tokens);
    }
    Ok(())
}

/// Runs the MTP over the pending pairs `(h[t], x[t+1])`. Without `root` the last pending row
/// waits (its next token is unknown); with it every row runs (the last pair's token is the
/// root), the result's last row is depth 1 of the next draft, and that row stays pending so a
/// later draft under another root recomputes it. Returns the final chunk's output (logits of
/// its last row only when `root` is given).
fn catch_up<O: Ops>(
    model: &Qwen36Model<O>,
    ops: &O,
    s: &mut Qwen36Scratch<O>,
    layout: &KvLayout,
    seq: &mut MtpSeq,
    spare: &mut Vec<PageId>,
    root: Option<u32>,
) -> Result<Option<MtpOutput>, EngineError> {
    let r = seq.tokens.len();
    let h = model.hparams().hidden_size;
    let rows = if root.is_some() { r } else { r.saturating_sub(1) };
    if rows == 0 {
        return Ok(None);
    }
    let mut next: Vec<u32> = seq.tokens[1..].to_vec();
    if let Some(root) = root {
        next.push(root);
    }
    seq.ensure_pages(ops, spare, layout, seq.kv_len + rows + 1)?;
    let mut last = None;
    let mut at = 0;
    while at < rows {
        let m = (rows - at).min(CATCH_UP_CHUNK);
        let final_chunk = at + m == rows;
        let input = MtpInput {
            tokens: &next[at..at + m],
            hidden: &seq.hidden[at * h..(at + m) * h],
            start_pos: seq.kv_len + at,
            pages: &seq.pages,
        };
        let want = if final_chunk && root.is_some() { MtpLogits::Last } else { MtpLogits::None };
        let out = model.mtp_forward_with(ops, layout, &input, None, s, want)?;
        if final_chunk {
            last = Some(out);
        }
        at += m;
    }
    // Rows written are committed; with a root, the last one stays pending (see above).
    let done = if root.is_some() { rows - 1 } else { rows };
    seq.kv_len += done;
    seq.hidden.drain(..done * h);
    seq.tokens.drain(..done);
    Ok(last)
}

/// The `k` most likely tokens of `logits` with their log-softmax values, best first; ties go
/// to the smaller token id; NaN logits never qualify.
pub fn top_k_log_probs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() || k == 0 {
        return Vec::new();
    }
    let lse = max + logits.iter().filter(|v| !v.is_nan()).map(|&v| (v - max).exp()).sum::<f32>().ln();
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() || (best.len() == k && v <= best[k - 1].1) {
            continue;
        }
        // Insert after every entry >= v: equal logits keep the earlier (smaller) id first.
        let at = best.iter().position(|&(_, b)| b < v).unwrap_or(best.len());
        best.insert(at, (i as u32, v));
        best.truncate(k);
    }
    best.into_iter().map(|(t, v)| (t, (v - lse).min(0.0))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_breaks_ties_by_id_and_normalises() {
        let logits = [1.0, 3.0, f32::NAN, 3.0, -2.0, 0.5];
        let c = top_k_log_probs(&logits, 3);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 3, 0]);
        let z: f32 = [1.0f32, 3.0, 3.0, -2.0, 0.5].iter().map(|v| v.exp()).sum();
        assert!((c[0].1 - (3.0 - z.ln())).abs() < 1e-6);
        assert_eq!(c[0].1, c[1].1);
        assert!(c[2].1 < c[1].1);
        assert_eq!(top_k_log_probs(&logits, 10).len(), 5);
        assert!(top_k_log_probs(&[f32::NAN], 2).is_empty());
        assert!(top_k_log_probs(&logits, 0).is_empty());
    }
}
