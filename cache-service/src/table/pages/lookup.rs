//! Lookup: the longest cached prefix of a prompt at token granularity, and for hybrid models
//! the longest one that also ends exactly at a recurrent-state snapshot. A child module of
//! the page table, so it reads the table's private state directly.

use super::{LookupHit, MissReason, PageTable};
use crate::error::CacheError;
use crate::hash::{PageHash, chain_hash, content_root, root_hash};

impl PageTable {
    /// Finds the longest cached prefix of `tokens` at token granularity (leaving at least the
    /// last token uncached, since the engine must compute its logits) and pins its pages to
    /// the session: full pages first, then the child of the matched prefix (a partial page or
    /// a full page) sharing the most leading tokens with the rest of the prompt.
    pub fn lookup(&mut self, session: u64, cache_salt: &str, tokens: &[u32]) -> Result<LookupHit, CacheError> {
        self.lookup_with_state(session, cache_salt, tokens, None)
    }

    /// [`PageTable::lookup`]; with `want_state = Some(state_bytes)` the served prefix is cut
    /// back to the longest one ending exactly at a cached snapshot of that size (nothing is
    /// served without one), and the snapshot is pinned too. The tokens given up for lack of
    /// a snapshot are counted as `NoStateSnapshot` misses.
    pub fn lookup_with_state(
        &mut self,
        session: u64,
        cache_salt: &str,
        tokens: &[u32],
        want_state: Option<u64>,
    ) -> Result<LookupHit, CacheError> {
        let s = self.sessions.get(&session).ok_or(CacheError::UnknownSession(session))?;
        let pt = self.page_tokens;
        let limit = tokens.len().saturating_sub(1);
        let mut prev = root_hash(&s.model_fingerprint, cache_salt);
        // bounds[i]: hash of the prefix of i full pages (bounds[0] is the root).
        let mut bounds: Vec<PageHash> = vec![prev];
        let mut hits: Vec<u32> = Vec::new();
        // Hash of the first full page that missed, for the miss reason.
        let mut missed_hash: Option<PageHash> = None;
        while (hits.len() + 1) * pt <= limit {
            let pos = hits.len() * pt;
            let page_tokens = &tokens[pos..pos + pt];
            let h = chain_hash(prev, page_tokens);
            let Some(&id) = self.by_hash.get(&h) else {
                missed_hash = Some(h);
                break;
            };
            let p = &self.pages[id as usize];
            // The stored tokens and the parent link verify the whole prefix, so a hash
            // collision can only cost a miss.
            if *p.tokens != *page_tokens || p.parent_hash != prev || p.parent != hits.last().copied() {
                tracing::warn!(page = id, "page hash collision: stored tokens differ; treating as a miss");
                break;
            }
            hits.push(id);
            prev = h;
            bounds.push(h);
        }
        let kv_full_tokens = hits.len() * pt;
        let rest = &tokens[kv_full_tokens.min(limit)..limit];
        let mut best: Option<(u32, usize)> = None;
        if !rest.is_empty()
            && let Some(kids) = self.children_of.get(&prev)
        {
            for &id in kids {
                let p = &self.pages[id as usize];
                if p.parent != hits.last().copied() {
                    continue;
                }
                let m = p.tokens.iter().zip(rest).take_while(|(a, b)| a == b).count();
                if m > best.map_or(0, |b| b.1) {
                    best = Some((id, m));
                }
            }
        }
        let kv_cached = kv_full_tokens + best.map_or(0, |b| b.1);

        // The served prefix: all of it, or up to the deepest matching snapshot.
        let state = want_state.and_then(|bytes| self.find_state(&bounds, tokens, kv_cached, bytes));
        let served = match (want_state, &state) {
            (None, _) => kv_cached,
            (Some(_), Some((_, position))) => *position,
            (Some(_), None) => 0,
        };
        let whole = (served / pt).min(hits.len());
        let full_page_tokens = whole * pt;
        let partial_page_tokens = served - full_page_tokens;
        let mut page_ids = hits[..whole].to_vec();
        if partial_page_tokens > 0 {
            // The page holding the served tail: the next full page (used in part), or the
            // best child of the last full page.
            match (hits.get(whole), best) {
                (Some(&id), _) => page_ids.push(id),
                (None, Some((id, _))) => page_ids.push(id),
                (None, None) => {
                    // Unreachable: `served <= kv_cached` is covered by hits and best.
                    return Err(CacheError::InvalidArgument("lookup lost the page of its own tail".into()));
                }
            }
        }
        for &id in &page_ids {
            self.pin(session, id);
        }
        let state_hit = state.map(|(slot, _)| self.pin_state(session, slot));

        let kv_missed = tokens.len() - kv_cached;
        let kv_reason = if kv_missed <= 1 {
            MissReason::None
        } else if missed_hash.is_some_and(|h| self.evicted.contains(&h)) {
            MissReason::Evicted
        } else if kv_full_tokens + pt <= tokens.len() && {
            let n = kv_full_tokens / pt + 1;
            let content = crate::hash::page_hashes(content_root(), tokens, pt, n);
            content.last().is_some_and(|c| self.by_content.contains_key(c))
        } {
            MissReason::SaltMismatch
        } else {
            MissReason::NoMatch
        };
        let missed = tokens.len() - served;
        let short = kv_cached - served;
        let miss_reason = if missed <= 1 {
            MissReason::None
        } else if short > 0 {
            MissReason::NoStateSnapshot
        } else {
            kv_reason
        };
        let c = &mut self.counters;
        c.lookups += 1;
        c.prompt_tokens_queried += tokens.len() as u64;
        c.tokens_hit_full_pages += full_page_tokens as u64;
        c.tokens_hit_partial_pages += partial_page_tokens as u64;
        if want_state.is_some() {
            c.state_lookups += 1;
            c.state_restores += u64::from(state_hit.is_some());
        }
        if missed > 0 {
            c.tokens_missed_last_token += 1;
            c.tokens_missed_no_state += short as u64;
            let other = kv_missed.saturating_sub(1) as u64;
            match kv_reason {
                MissReason::None | MissReason::NoStateSnapshot => {}
                MissReason::NoMatch => c.tokens_missed_no_match += other,
                MissReason::Evicted => c.tokens_missed_evicted += other,
                MissReason::SaltMismatch => c.tokens_missed_salt_mismatch += other,
            }
        }
        Ok(LookupHit {
            page_ids,
            cached_tokens: served,
            full_page_tokens,
            partial_page_tokens,
            miss_reason,
            kv_cached_tokens: kv_cached,
            state: state_hit,
        })
    }
}
