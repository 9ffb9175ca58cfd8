//! Behaviour tests of the page table, including a seeded randomized invariant test.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{MissReason, PageTable};
use crate::error::CacheError;
use crate::hash::{chain_hash, root_hash};

const PT: usize = 4;

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| i.wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Allocates pages for `tokens`, commits them, and releases them: the prompt is then cached.
fn cache_prompt(t: &mut PageTable, session: u64, salt: &str, tokens: &[u32]) -> Vec<u32> {
    let n = tokens.len().div_ceil(PT) as u32;
    let ids = t.allocate(session, n).unwrap();
    assert_eq!(ids.len(), n as usize);
    t.commit(session, salt, tokens, &ids).unwrap();
    t.release(session, &ids).unwrap();
    ids
}

#[test]
fn lookup_hits_committed_prefix_but_leaves_the_last_token() {
    let mut t = PageTable::new(16, PT);
    let s = t.open_session("model");
    let tokens = prompt(12, 1);
    cache_prompt(&mut t, s, "", &tokens);
    // 12 tokens = 3 full pages, but the last token must be recomputed: 2 whole pages and
    // the head (3 tokens) of the third.
    let hit = t.lookup(s, "", &tokens).unwrap();
    assert_eq!(hit.page_ids.len(), 3);
    assert_eq!((hit.cached_tokens, hit.full_page_tokens, hit.partial_page_tokens), (11, 8, 3));
    assert_eq!(hit.miss_reason, MissReason::None);
    let mut longer = tokens.clone();
    longer.push(5);
    let hit = t.lookup(s, "", &longer).unwrap();
    assert_eq!(hit.cached_tokens, 12);
    t.check_invariants().unwrap();
}

#[test]
fn salts_and_fingerprints_isolate_pages() {
    let mut t = PageTable::new(16, PT);
    let a = t.open_session("model");
    let other_model = t.open_session("other-model");
    let tokens = prompt(13, 2);
    cache_prompt(&mut t, a, "tenant-a", &tokens);
    assert_eq!(t.lookup(a, "tenant-b", &tokens).unwrap().cached_tokens, 0);
    assert_eq!(t.lookup(other_model, "tenant-a", &tokens).unwrap().cached_tokens, 0);
    assert_eq!(t.lookup(a, "tenant-a", &tokens).unwrap().cached_tokens, 12);
}

#[test]
fn a_colliding_entry_with_other_tokens_is_never_served() {
    let mut t = PageTable::new(8, PT);
    let s = t.open_session("model");
    let tokens = prompt(9, 3);
    let root = root_hash("model", "");
    let h0 = chain_hash(root, &tokens[..PT]);
    // Page 5 claims the prompt's first-page hash but holds different tokens.
    t.force_entry(h0, root, 5, &[7, 7, 7, 7]);
    let hit = t.lookup(s, "", &tokens).unwrap();
    assert!(hit.page_ids.is_empty());
    assert_eq!(hit.cached_tokens, 0);
    // Committing the real prompt cannot publish under the taken hash, nor past it.
    let ids = t.allocate(s, 2).unwrap();
    assert_eq!(t.commit(s, "", &tokens, &ids).unwrap(), 0);
    assert_eq!(t.lookup(s, "", &tokens).unwrap().cached_tokens, 0);
    // The forged entry is the only inconsistency, and the checker sees it.
    let err = t.check_invariants().unwrap_err();
    assert!(err.contains("page 5: hash does not match"), "{err}");
}

#[test]
fn commit_of_an_already_cached_prefix_keeps_the_first_copy() {
    let mut t = PageTable::new(16, PT);
    let a = t.open_session("m");
    let b = t.open_session("m");
    let tokens = prompt(8, 4);
    let ids_a = t.allocate(a, 2).unwrap();
    let ids_b = t.allocate(b, 2).unwrap();
    assert_eq!(t.commit(a, "", &tokens, &ids_a).unwrap(), 2);
    assert_eq!(t.commit(b, "", &tokens, &ids_b).unwrap(), 0);
    // Re-committing (incremental commits) is a no-op.
    assert_eq!(t.commit(a, "", &tokens, &ids_a).unwrap(), 0);
    t.release(b, &ids_b).unwrap();
    assert_eq!(t.stats().pages_free, 14, "b's duplicate pages are freed on release");
    t.check_invariants().unwrap();
}

#[test]
fn commit_rejects_pages_committed_for_other_tokens_without_changes() {
    let mut t = PageTable::new(16, PT);
    let s = t.open_session("m");
    let ids = t.allocate(s, 2).unwrap();
    t.commit(s, "", &prompt(8, 5), &ids).unwrap();
    let fresh = t.allocate(s, 1).unwrap();
    let before = t.stats();
    let err = t.commit(s, "", &prompt(12, 6), &[ids[0], ids[1], fresh[0]]).unwrap_err();
    assert!(matches!(err, CacheError::PageMismatch { index: 0, .. }), "{err}");
    assert_eq!(t.stats(), before);
    t.check_invariants().unwrap();
}

#[test]
fn bad_ids_are_errors_not_panics() {
    let mut t = PageTable::new(4, PT);
    let s = t.open_session("m");
    assert!(matches!(t.lookup(99, "", &[1, 2, 3]), Err(CacheError::UnknownSession(99))));
    assert!(matches!(t.allocate(99, 1), Err(CacheError::UnknownSession(99))));
    assert!(matches!(t.release(s, &[100]), Err(CacheError::PageOutOfRange { page: 100, count: 4 })));
    assert!(matches!(t.release(s, &[0]), Err(CacheError::PageNotHeld { .. })));
    let ids = t.allocate(s, 1).unwrap();
    assert!(matches!(t.release(s, &[ids[0], ids[0]]), Err(CacheError::PageNotHeld { .. })));
    assert!(t.commit(s, "", &prompt(8, 0), &[ids[0], ids[0]]).is_err());
    let other = t.open_session("m");
    assert!(matches!(t.commit(other, "", &prompt(4, 0), &ids), Err(CacheError::PageNotHeld { .. })));
    t.check_invariants().unwrap();
}

#[test]
fn allocation_that_does_not_fit_returns_nothing_and_evicts_nothing() {
    let mut t = PageTable::new(6, PT);
    let s = t.open_session("m");
    cache_prompt(&mut t, s, "", &prompt(8, 7));
    let pinned = t.allocate(s, 3).unwrap();
    assert_eq!(pinned.len(), 3);
    // 1 free + 2 cached = 3 < 4.
    assert!(t.allocate(s, 4).unwrap().is_empty());
    assert_eq!(t.stats().pages_cached, 2);
    assert_eq!(t.stats().counters.evictions, 0);
    // 3 fit by evicting both cached pages, leaf first.
    assert_eq!(t.allocate(s, 3).unwrap().len(), 3);
    assert_eq!(t.stats().counters.evictions, 2);
    t.check_invariants().unwrap();
}

#[test]
fn eviction_is_lru_and_leaves_first() {
    let mut t = PageTable::new(6, PT);
    let s = t.open_session("m");
    let old = prompt(12, 8);
    let new = prompt(8, 9);
    cache_prompt(&mut t, s, "", &old);
    cache_prompt(&mut t, s, "", &new);
    // Touch the old conversation's root only: its tail is still older than `new`.
    let hit = t.lookup(s, "", &old[..5]).unwrap();
    assert_eq!(hit.page_ids.len(), 1);
    t.release(s, &hit.page_ids).unwrap();
    // One free page; the next two must come from the old chain's two tail pages.
    let got = t.allocate(s, 3).unwrap();
    assert_eq!(got.len(), 3);
    t.check_invariants().unwrap();
    assert_eq!(t.lookup(s, "", &[old.clone(), vec![0]].concat()).unwrap().cached_tokens, 4);
    assert_eq!(t.lookup(s, "", &[new.clone(), vec![0]].concat()).unwrap().cached_tokens, 8);
    t.check_invariants().unwrap();
}

#[test]
fn a_pinned_leaf_protects_its_ancestors() {
    let mut t = PageTable::new(4, PT);
    let s = t.open_session("m");
    let tokens = prompt(13, 10);
    cache_prompt(&mut t, s, "", &tokens[..12]);
    let hit = t.lookup(s, "", &tokens).unwrap();
    assert_eq!(hit.page_ids.len(), 3);
    t.release(s, &hit.page_ids[..2]).unwrap();
    // Pages 0 and 1 are unreferenced but have a pinned descendant: not reclaimable.
    assert!(t.allocate(s, 2).unwrap().is_empty());
    assert_eq!(t.allocate(s, 1).unwrap().len(), 1);
    t.check_invariants().unwrap();
}

#[test]
fn closing_a_session_drops_all_its_references() {
    let mut t = PageTable::new(8, PT);
    let s = t.open_session("m");
    let tokens = prompt(9, 11);
    cache_prompt(&mut t, s, "", &tokens[..8]);
    let other = t.open_session("m");
    let hit = t.lookup(other, "", &tokens).unwrap();
    assert_eq!(hit.page_ids.len(), 2);
    let _writable = t.allocate(other, 3).unwrap();
    assert_eq!(t.stats().pages_pinned, 5);
    assert_eq!(t.close_session(other), 5);
    let st = t.stats();
    assert_eq!((st.pages_pinned, st.pages_free, st.pages_cached, st.sessions), (0, 6, 2, 1));
    t.check_invariants().unwrap();
}

/// Random operations from several sessions; after each one every invariant must hold,
/// committed pages never change their tokens, and dropping every session frees all refs.
#[test]
fn randomized_operations_keep_every_invariant() {
    let (mut hits, mut evictions, mut published) = (0u64, 0u64, 0u64);
    let (mut partial_hits, mut partial_published) = (0u64, 0u64);
    for seed in 0..8u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut t = PageTable::new(rng.random_range(4..40), PT);
        // A few base conversations so prompts share prefixes.
        let bases: Vec<Vec<u32>> = (0..4).map(|b| (0..64).map(|i| (i * 7 + b * 1000) % 50).collect()).collect();
        let mut sessions: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut seen_tokens = std::collections::HashMap::new();
        for step in 0..3000 {
            if sessions.is_empty() || rng.random_bool(0.02) {
                sessions.push((t.open_session(if rng.random_bool(0.8) { "m" } else { "m2" }), Vec::new()));
            }
            let k = rng.random_range(0..sessions.len());
            let sid = sessions[k].0;
            let salt = if rng.random_bool(0.9) { "" } else { "x" };
            let base = &bases[rng.random_range(0..bases.len())];
            let len = rng.random_range(1..base.len());
            let mut tokens = base[..len].to_vec();
            if rng.random_bool(0.3) {
                let at = rng.random_range(0..tokens.len());
                tokens[at] = rng.random_range(0..50);
            }
            match rng.random_range(0..100) {
                0..30 => {
                    let hit = t.lookup(sid, salt, &tokens).unwrap();
                    assert!(hit.cached_tokens < tokens.len().max(1));
                    assert_eq!(hit.cached_tokens, hit.full_page_tokens + hit.partial_page_tokens);
                    let whole = hit.page_ids.len() - usize::from(hit.partial_page_tokens > 0);
                    assert_eq!(hit.full_page_tokens, whole * PT);
                    assert!(hit.partial_page_tokens < PT);
                    // Every served token is the prompt's own token: exactness at token level.
                    let stored: std::collections::HashMap<u32, Vec<u32>> =
                        t.committed_pages().into_iter().map(|(id, _, toks)| (id, toks)).collect();
                    for (i, id) in hit.page_ids.iter().enumerate() {
                        let n = (hit.cached_tokens - i * PT).min(PT);
                        assert_eq!(stored[id][..n], tokens[i * PT..i * PT + n], "seed {seed} step {step}");
                    }
                    sessions[k].1.extend(&hit.page_ids);
                }
                30..55 => {
                    let n = rng.random_range(0..6);
                    let ids = t.allocate(sid, n).unwrap();
                    assert!(ids.is_empty() || ids.len() == n as usize);
                    sessions[k].1.extend(&ids);
                }
                55..80 => {
                    // Commit a sequence made of a lookup hit plus fresh pages (the engine's flow);
                    // sometimes without the lookup, as when two engines prefill the same prompt
                    // at once and the second publishes over unpinned cached pages.
                    let hit = if rng.random_bool(0.6) {
                        t.lookup(sid, salt, &tokens).unwrap()
                    } else {
                        super::LookupHit::default()
                    };
                    // A page used in part is shared: the engine copies it (copy on write) into
                    // a fresh page, so only the whole pages join the sequence.
                    let whole = hit.full_page_tokens / PT;
                    sessions[k].1.extend(&hit.page_ids);
                    let need = tokens.len().div_ceil(PT) - whole;
                    let fresh = t.allocate(sid, need as u32).unwrap();
                    let mut pages = hit.page_ids[..whole].to_vec();
                    pages.extend(&fresh);
                    sessions[k].1.extend(&fresh);
                    if fresh.len() == need {
                        let tail = rng.random_bool(0.5);
                        t.commit_with_tail(sid, salt, &tokens, &pages, tail).unwrap();
                    }
                }
                80..95 => {
                    let held = &mut sessions[k].1;
                    let n = rng.random_range(0..=held.len());
                    let ids: Vec<u32> = held.drain(..n).collect();
                    t.release(sid, &ids).unwrap();
                }
                _ => {
                    t.close_session(sid);
                    sessions.swap_remove(k);
                }
            }
            if let Err(e) = t.check_invariants() {
                panic!("seed {seed} step {step}: {e}");
            }
            for (id, hash, toks) in t.committed_pages() {
                let prev = seen_tokens.insert((id, hash), toks.clone());
                assert!(prev.is_none_or(|p| p == toks), "seed {seed}: committed page {id} changed tokens");
            }
            let st = t.stats();
            assert!(st.pages_free + st.pages_pinned <= st.pages_total);
            assert!(st.pages_cached + st.pages_free <= st.pages_total);
        }
        for (sid, _) in sessions.drain(..) {
            t.close_session(sid);
        }
        t.check_invariants().unwrap();
        let st = t.stats();
        assert_eq!(st.pages_pinned, 0, "seed {seed}");
        assert_eq!(st.pages_free + st.pages_cached, st.pages_total, "seed {seed}");
        let c = st.counters;
        assert_eq!(
            c.tokens_hit_full_pages
                + c.tokens_hit_partial_pages
                + c.tokens_missed_no_match
                + c.tokens_missed_evicted
                + c.tokens_missed_salt_mismatch
                + c.tokens_missed_last_token,
            c.prompt_tokens_queried,
            "seed {seed}: hits and misses must add up"
        );
        partial_hits += c.tokens_hit_partial_pages;
        partial_published += c.partial_pages_committed;
        hits += st.counters.tokens_hit_full_pages;
        evictions += st.counters.evictions;
        published += st.counters.pages_committed;
    }
    // The run must have exercised the interesting paths.
    assert!(
        hits > 0 && evictions > 0 && published > 0 && partial_hits > 0 && partial_published > 0,
        "hits {hits} evictions {evictions} published {published} partial hits {partial_hits} \
         partial published {partial_published}"
    );
}

#[test]
fn partial_tail_is_cached_and_reused_at_token_granularity() {
    let mut t = PageTable::new(16, PT);
    let s = t.open_session("m");
    // A turn of 10 tokens: 2 full pages + a 2-token tail, committed with its tail.
    let turn = prompt(10, 20);
    let ids = t.allocate(s, 3).unwrap();
    assert_eq!(t.commit_with_tail(s, "", &turn, &ids, true).unwrap(), 3);
    t.release(s, &ids).unwrap();
    assert_eq!(t.stats().pages_partial, 1);
    t.check_invariants().unwrap();
    // The next turn extends it: all 10 tokens come back (8 full + 2 partial).
    let mut next = turn.clone();
    next.extend([7, 8, 9]);
    let hit = t.lookup(s, "", &next).unwrap();
    assert_eq!((hit.full_page_tokens, hit.partial_page_tokens), (8, 2));
    assert_eq!(hit.page_ids.len(), 3);
    assert_eq!(hit.page_ids[2], ids[2]);
    // A prompt diverging inside the tail gets only the common head of it.
    let mut diverged = turn[..9].to_vec();
    diverged.extend([999, 1]);
    let hit2 = t.lookup(s, "", &diverged).unwrap();
    assert_eq!((hit2.full_page_tokens, hit2.partial_page_tokens), (8, 1));
    // Other salts never see the tail.
    let other = t.lookup(s, "tenant", &next).unwrap();
    assert_eq!(other.cached_tokens, 0);
    assert_eq!(other.miss_reason, MissReason::SaltMismatch);
    // The same tail committed again is not duplicated.
    let ids2 = t.allocate(s, 1).unwrap();
    let again = [ids[0], ids[1], ids2[0]];
    assert_eq!(t.commit_with_tail(s, "", &turn, &again, true).unwrap(), 0);
    t.release(s, &ids2).unwrap();
    t.release(s, &hit.page_ids).unwrap();
    t.release(s, &hit2.page_ids).unwrap();
    assert_eq!(t.stats().pages_pinned, 0);
    let c = t.stats().counters;
    assert_eq!(c.tokens_hit_partial_pages, 3);
    assert!(c.tokens_missed_salt_mismatch > 0);
    t.check_invariants().unwrap();
}

#[test]
fn a_partial_page_is_a_leaf_and_is_evicted_before_its_parent() {
    let mut t = PageTable::new(3, PT);
    let s = t.open_session("m");
    let turn = prompt(6, 30);
    let ids = t.allocate(s, 2).unwrap();
    t.commit_with_tail(s, "", &turn, &ids, true).unwrap();
    t.release(s, &ids).unwrap();
    // One free page; asking for two evicts exactly one page: the partial leaf.
    let got = t.allocate(s, 2).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(t.stats().counters.evictions, 1);
    assert_eq!(t.stats().pages_partial, 0);
    t.release(s, &got).unwrap();
    let hit = t.lookup(s, "", &[turn.clone(), vec![1]].concat()).unwrap();
    assert_eq!((hit.full_page_tokens, hit.partial_page_tokens), (4, 0));
    assert_eq!(hit.miss_reason, MissReason::NoMatch);
    t.check_invariants().unwrap();
}

#[test]
fn misses_are_classified_evicted_and_no_match() {
    let mut t = PageTable::new(2, PT);
    let s = t.open_session("m");
    let a = prompt(8, 40);
    cache_prompt(&mut t, s, "", &a);
    // Filling the arena with another prompt evicts both pages of `a`.
    cache_prompt(&mut t, s, "", &prompt(8, 41));
    let hit = t.lookup(s, "", &[a.clone(), vec![5]].concat()).unwrap();
    assert_eq!(hit.cached_tokens, 0);
    assert_eq!(hit.miss_reason, MissReason::Evicted);
    let c = t.stats().counters;
    assert_eq!((c.tokens_missed_evicted, c.tokens_missed_last_token), (8, 1));
    let fresh = t.lookup(s, "", &prompt(9, 42)).unwrap();
    assert_eq!(fresh.miss_reason, MissReason::NoMatch);
    t.release(s, &hit.page_ids).unwrap();
    t.release(s, &fresh.page_ids).unwrap();
    t.check_invariants().unwrap();
}

#[test]
fn kv_events_name_full_pages_stored_and_evicted_and_a_reformat_clears_them() {
    use crate::events::KvEvent;
    let mut t = PageTable::new(4, PT);
    let s = t.open_session("model");
    // Not recording: nothing is kept.
    cache_prompt(&mut t, s, "", &prompt(4, 9));
    assert!(t.take_events().is_empty());
    t.reformat(4, PT);
    t.record_events();
    let first = prompt(10, 1);
    let ids = t.allocate(s, 3).unwrap();
    // Two full pages and a partial tail: the tail is not an event.
    t.commit_with_tail(s, "", &first, &ids, true).unwrap();
    t.release(s, &ids).unwrap();
    let events = t.take_events();
    let hashes: Vec<u64> = events
        .iter()
        .map(|e| match e {
            KvEvent::Stored { hash, .. } => *hash,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        events,
        [
            KvEvent::Stored { hash: hashes[0], parent: None, tokens: first[..4].to_vec() },
            KvEvent::Stored { hash: hashes[1], parent: Some(hashes[0]), tokens: first[4..8].to_vec() },
        ]
    );
    let mut committed: Vec<u64> =
        t.committed_pages().iter().filter(|(_, _, tok)| tok.len() == PT).map(|(_, h, _)| h.event_id()).collect();
    let mut named = hashes.clone();
    committed.sort_unstable();
    named.sort_unstable();
    assert_eq!(committed, named, "the events name the table's own hashes");
    assert!(t.take_events().is_empty(), "taken once");
    // A prompt of three pages in a four-page arena takes the free page and evicts the
    // partial tail (no event) and then the older chain's leaf.
    cache_prompt(&mut t, s, "", &prompt(12, 2));
    let events = t.take_events();
    let removed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Removed { hash } => Some(*hash),
            _ => None,
        })
        .collect();
    assert_eq!(removed, [hashes[1]], "{events:?}");
    assert_eq!(events.iter().filter(|e| matches!(e, KvEvent::Stored { .. })).count(), 3);
    t.reformat(8, PT);
    assert_eq!(t.take_events(), [KvEvent::AllCleared], "a reformat keeps recording and clears");
    t.check_invariants().unwrap();
}
