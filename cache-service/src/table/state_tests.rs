//! Behaviour tests of recurrent-state snapshots in the page table, including a seeded
//! randomized test that mixes page and state operations and checks every invariant.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{MissReason, PageTable};
use crate::error::CacheError;

const PT: usize = 4;
/// Pages per snapshot in these tests.
const SP: usize = 2;
const SB: u64 = 1000;

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| i.wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Caches `tokens` (full pages and the partial tail) and releases the pages.
fn cache_prompt(t: &mut PageTable, s: u64, salt: &str, tokens: &[u32]) {
    let n = tokens.len().div_ceil(PT) as u32;
    let ids = t.allocate(s, n).unwrap();
    assert_eq!(ids.len(), n as usize);
    t.commit_with_tail(s, salt, tokens, &ids, true).unwrap();
    t.release(s, &ids).unwrap();
}

/// Stores a snapshot after `tokens`; returns whether it was published.
fn snapshot(t: &mut PageTable, s: u64, salt: &str, tokens: &[u32]) -> bool {
    let a = t.allocate_state(s, salt, tokens, SB, SP).unwrap();
    if a.already_cached || a.page_ids.is_empty() {
        return false;
    }
    assert_eq!(a.page_ids.len(), SP);
    let ok = t.commit_state(s, a.slot).unwrap();
    t.release_all(s, &[], &[a.slot]).unwrap();
    ok
}

fn release_hit(t: &mut PageTable, s: u64, hit: &super::LookupHit) {
    let slots: Vec<u32> = hit.state.iter().map(|x| x.slot).collect();
    t.release_all(s, &hit.page_ids, &slots).unwrap();
}

#[test]
fn a_state_is_served_exactly_at_its_position_and_kv_beyond_it_is_given_up() {
    let mut t = PageTable::new(32, PT);
    let s = t.open_session("m");
    // Turn 1: a 10-token prompt (2 full pages + a 2-token tail), snapshot at its end.
    let turn = prompt(10, 1);
    cache_prompt(&mut t, s, "", &turn);
    assert!(snapshot(&mut t, s, "", &turn));
    // The answer went on to 14 tokens, cached without a snapshot there.
    let answered = prompt(14, 1);
    cache_prompt(&mut t, s, "", &answered);
    let next = prompt(19, 1);
    let hit = t.lookup_with_state(s, "", &next, Some(SB)).unwrap();
    assert_eq!((hit.cached_tokens, hit.kv_cached_tokens), (10, 14));
    assert_eq!((hit.full_page_tokens, hit.partial_page_tokens), (8, 2));
    assert_eq!(hit.page_ids.len(), 3);
    let st = hit.state.clone().unwrap();
    assert_eq!((st.position, st.page_ids.len(), st.state_bytes), (10, SP, SB));
    assert_eq!(hit.miss_reason, MissReason::NoStateSnapshot);
    let c = t.stats().counters;
    assert_eq!((c.tokens_missed_no_state, c.state_restores, c.state_lookups), (4, 1, 1));
    assert_eq!(t.stats().states_pinned, 1);
    t.check_invariants().unwrap();
    release_hit(&mut t, s, &hit);
    // Without a state the KV alone serves 14.
    let plain = t.lookup(s, "", &next).unwrap();
    assert_eq!((plain.cached_tokens, plain.state.is_none()), (14, true));
    t.release(s, &plain.page_ids).unwrap();
    // A snapshot at 14 (end of generation) is preferred from then on.
    assert!(snapshot(&mut t, s, "", &answered));
    let hit = t.lookup_with_state(s, "", &next, Some(SB)).unwrap();
    assert_eq!(hit.cached_tokens, 14);
    assert_eq!(hit.state.as_ref().map(|x| x.position), Some(14));
    assert_eq!(hit.miss_reason, MissReason::NoMatch);
    release_hit(&mut t, s, &hit);
    // A prompt diverging at 12 falls back to the snapshot at 10.
    let mut diverged = answered[..12].to_vec();
    diverged.extend([777, 778, 779]);
    let hit = t.lookup_with_state(s, "", &diverged, Some(SB)).unwrap();
    assert_eq!((hit.cached_tokens, hit.kv_cached_tokens), (10, 12));
    release_hit(&mut t, s, &hit);
    // A snapshot of another size is never served.
    let hit = t.lookup_with_state(s, "", &next, Some(SB + 1)).unwrap();
    assert_eq!((hit.cached_tokens, hit.page_ids.len(), hit.state.is_none()), (0, 0, true));
    assert_eq!(t.stats().pages_pinned, 0);
    let c = t.stats().counters;
    assert_eq!(
        c.tokens_hit_full_pages
            + c.tokens_hit_partial_pages
            + c.tokens_missed_no_match
            + c.tokens_missed_no_state
            + c.tokens_missed_last_token,
        c.prompt_tokens_queried
    );
    t.check_invariants().unwrap();
}

#[test]
fn snapshots_at_page_boundaries_and_inside_full_pages_are_found() {
    let mut t = PageTable::new(32, PT);
    let s = t.open_session("m");
    let long = prompt(20, 2);
    cache_prompt(&mut t, s, "", &long);
    assert!(snapshot(&mut t, s, "", &long[..8]));
    assert!(snapshot(&mut t, s, "", &long[..13]));
    assert!(snapshot(&mut t, s, "", &long[..3]));
    // Deepest first: 13 sits inside full page 3, used in part.
    let hit = t.lookup_with_state(s, "", &long, Some(SB)).unwrap();
    assert_eq!((hit.cached_tokens, hit.full_page_tokens, hit.partial_page_tokens), (13, 12, 1));
    assert_eq!(hit.page_ids.len(), 4);
    release_hit(&mut t, s, &hit);
    let hit = t.lookup_with_state(s, "", &long[..13], Some(SB)).unwrap();
    assert_eq!((hit.cached_tokens, hit.full_page_tokens, hit.page_ids.len()), (8, 8, 2));
    release_hit(&mut t, s, &hit);
    let hit = t.lookup_with_state(s, "", &long[..8], Some(SB)).unwrap();
    assert_eq!((hit.cached_tokens, hit.partial_page_tokens), (3, 3));
    release_hit(&mut t, s, &hit);
    // Nothing below the first snapshot: nothing served, and it is said why.
    let hit = t.lookup_with_state(s, "", &long[..3], Some(SB)).unwrap();
    assert_eq!((hit.cached_tokens, hit.kv_cached_tokens), (0, 2));
    assert_eq!(hit.miss_reason, MissReason::NoStateSnapshot);
    t.check_invariants().unwrap();
}

#[test]
fn salts_and_fingerprints_never_share_snapshots() {
    let mut t = PageTable::new(32, PT);
    let a = t.open_session("m");
    let other_model = t.open_session("m2");
    let p = prompt(9, 3);
    cache_prompt(&mut t, a, "tenant", &p);
    assert!(snapshot(&mut t, a, "tenant", &p));
    let longer = prompt(12, 3);
    for (s, salt) in [(a, ""), (a, "other"), (other_model, "tenant")] {
        let hit = t.lookup_with_state(s, salt, &longer, Some(SB)).unwrap();
        assert_eq!((hit.cached_tokens, hit.state.is_none()), (0, true));
    }
    let hit = t.lookup_with_state(a, "tenant", &longer, Some(SB)).unwrap();
    assert_eq!(hit.cached_tokens, 9);
    release_hit(&mut t, a, &hit);
    t.check_invariants().unwrap();
}

#[test]
fn commits_are_refused_without_kv_pages_and_deduplicated() {
    let mut t = PageTable::new(32, PT);
    let s = t.open_session("m");
    let p = prompt(10, 4);
    // No pages cached yet: written, but not published, and freed on release.
    let a = t.allocate_state(s, "", &p, SB, SP).unwrap();
    assert_eq!(a.page_ids.len(), SP);
    assert!(!t.commit_state(s, a.slot).unwrap());
    t.check_invariants().unwrap();
    t.release_all(s, &[], &[a.slot]).unwrap();
    assert_eq!((t.stats().state_pages, t.stats().pages_free), (0, 32));
    // Full pages cached but not the tail: still refused.
    let ids = t.allocate(s, 3).unwrap();
    t.commit(s, "", &p, &ids).unwrap();
    assert!(!snapshot(&mut t, s, "", &p));
    assert!(snapshot(&mut t, s, "", &p[..8]));
    t.commit_with_tail(s, "", &p, &ids, true).unwrap();
    assert!(snapshot(&mut t, s, "", &p));
    // Again: already cached, nothing leased.
    let again = t.allocate_state(s, "", &p, SB, SP).unwrap();
    assert!(again.already_cached && again.page_ids.is_empty());
    // Another writer of the same key loses the race quietly.
    let q = prompt(12, 4);
    let ids2 = t.allocate(s, 3).unwrap();
    t.commit(s, "", &q, &ids2).unwrap();
    let w1 = t.allocate_state(s, "", &q, SB, SP).unwrap();
    let w2 = t.allocate_state(s, "", &q, SB, SP).unwrap();
    assert!(t.commit_state(s, w1.slot).unwrap());
    assert!(!t.commit_state(s, w2.slot).unwrap());
    // Only the writer may commit, and releasing what is not held is an error.
    let other = t.open_session("m");
    assert!(matches!(t.commit_state(other, w1.slot), Err(CacheError::StateNotHeld { .. })));
    assert!(matches!(t.release_all(other, &[], &[w1.slot]), Err(CacheError::StateNotHeld { .. })));
    assert!(matches!(t.release_all(s, &[ids[0]], &[999]), Err(CacheError::StateNotHeld { .. })));
    t.release_all(s, &ids, &[w1.slot, w2.slot]).unwrap();
    t.release(s, &ids2).unwrap();
    assert!(t.allocate_state(s, "", &[], SB, SP).is_err());
    assert_eq!(t.stats().states_cached, 3);
    assert_eq!(t.stats().counters.states_committed, 3);
    t.check_invariants().unwrap();
}

#[test]
fn evicting_a_prefix_page_evicts_or_detaches_its_snapshots() {
    // 8 pages: a 10-token prompt (3 pages) + its snapshot (2 pages) + 3 free.
    let mut t = PageTable::new(8, PT);
    let s = t.open_session("m");
    let p = prompt(10, 5);
    cache_prompt(&mut t, s, "", &p);
    assert!(snapshot(&mut t, s, "", &p));
    assert!(snapshot(&mut t, s, "", &p[..4]));
    assert_eq!(t.stats().state_pages, 4);
    let longer = prompt(12, 5);
    let hit = t.lookup_with_state(s, "", &longer, Some(SB)).unwrap();
    assert_eq!(hit.cached_tokens, 10);
    // Keep the state pinned but drop its pages: the tail page becomes evictable.
    let slot = hit.state.as_ref().unwrap().slot;
    t.release(s, &hit.page_ids).unwrap();
    // The snapshot at 4 is used again (newer than the tail page now).
    assert!(t.allocate_state(s, "", &p[..4], SB, SP).unwrap().already_cached);
    // Needs 1 free page more than there is: the partial tail goes (oldest leaf), and with
    // it the pinned snapshot at 10 is detached (still held, never served again).
    let got = t.allocate(s, 2).unwrap();
    assert_eq!(got.len(), 2);
    t.check_invariants().unwrap();
    assert_eq!(t.stats().states_cached, 1);
    let hit2 = t.lookup_with_state(s, "", &longer, Some(SB)).unwrap();
    assert_eq!(hit2.cached_tokens, 4);
    release_hit(&mut t, s, &hit2);
    t.release_all(s, &got, &[slot]).unwrap();
    assert_eq!(t.stats().state_pages, 2, "the detached snapshot is freed with its last ref");
    // Filling the arena evicts the rest: the snapshot at 4 goes with (or before) page 0.
    let all = t.allocate(s, 8).unwrap();
    assert_eq!(all.len(), 8);
    let st = t.stats();
    assert_eq!((st.states_cached, st.state_pages, st.pages_cached), (0, 0, 0));
    assert_eq!(st.counters.state_evictions, 2);
    t.check_invariants().unwrap();
}

#[test]
fn snapshots_and_pages_are_evicted_in_one_lru_order() {
    let mut t = PageTable::new(8, PT);
    let s = t.open_session("m");
    let p = prompt(8, 6);
    cache_prompt(&mut t, s, "", &p);
    assert!(snapshot(&mut t, s, "", &p[..4]));
    // Re-snapshotting refreshes the old snapshot (it becomes the newest).
    let q = prompt(8, 7);
    cache_prompt(&mut t, s, "", &q);
    // p's pages and its snapshot are used again: q is now the least recently used.
    let touch = t.lookup(s, "", &prompt(9, 6)).unwrap();
    assert_eq!(touch.cached_tokens, 8);
    t.release(s, &touch.page_ids).unwrap();
    assert!(t.allocate_state(s, "", &p[..4], SB, SP).unwrap().already_cached);
    // 8 pages: p (2) + q (2) + snapshot (2) + 2 free. Asking for 4: q's two pages are the
    // oldest leaves; the snapshot and p's pages stay.
    let got = t.allocate(s, 4).unwrap();
    assert_eq!(got.len(), 4);
    let st = t.stats();
    assert_eq!((st.states_cached, st.pages_cached), (1, 2));
    let hit = t.lookup_with_state(s, "", &p, Some(SB)).unwrap();
    assert_eq!(hit.cached_tokens, 4);
    release_hit(&mut t, s, &hit);
    t.check_invariants().unwrap();
}

#[test]
fn closing_a_session_drops_its_snapshot_references() {
    let mut t = PageTable::new(16, PT);
    let s = t.open_session("m");
    let p = prompt(8, 8);
    cache_prompt(&mut t, s, "", &p);
    assert!(snapshot(&mut t, s, "", &p));
    let other = t.open_session("m");
    let hit = t.lookup_with_state(other, "", &prompt(9, 8), Some(SB)).unwrap();
    assert_eq!(hit.cached_tokens, 8);
    let writing = t.allocate_state(other, "", &prompt(6, 9), SB, SP).unwrap();
    assert_eq!(writing.page_ids.len(), SP);
    assert_eq!(t.stats().state_pages, 4);
    t.close_session(other);
    let st = t.stats();
    assert_eq!((st.state_pages, st.states_cached, st.states_pinned, st.pages_pinned), (2, 1, 0, 0));
    t.check_invariants().unwrap();
}

/// Random page and state operations from several sessions; after each one every invariant
/// must hold, every served state is at the served position with the prompt's own tokens,
/// and the token counters add up.
#[test]
fn randomized_page_and_state_operations_keep_every_invariant() {
    let (mut restores, mut stored, mut state_evictions, mut short) = (0u64, 0u64, 0u64, 0u64);
    for seed in 0..8u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut t = PageTable::new(rng.random_range(6..48), PT);
        let bases: Vec<Vec<u32>> = (0..3).map(|b| (0..48).map(|i| (i * 7 + b * 1000) % 50).collect()).collect();
        // (session, held pages, held slots)
        let mut sessions: Vec<(u64, Vec<u32>, Vec<u32>)> = Vec::new();
        for step in 0..2500 {
            if sessions.is_empty() || rng.random_bool(0.02) {
                let fp = if rng.random_bool(0.85) { "m" } else { "m2" };
                sessions.push((t.open_session(fp), Vec::new(), Vec::new()));
            }
            let k = rng.random_range(0..sessions.len());
            let sid = sessions[k].0;
            let salt = if rng.random_bool(0.9) { "" } else { "x" };
            let base = &bases[rng.random_range(0..bases.len())];
            let len = rng.random_range(1..base.len());
            let mut tokens = base[..len].to_vec();
            if rng.random_bool(0.2) {
                let at = rng.random_range(0..tokens.len());
                tokens[at] = rng.random_range(0..50);
            }
            let bytes = if rng.random_bool(0.95) { SB } else { SB * 3 };
            let n_pages = bytes.div_ceil(500) as usize;
            match rng.random_range(0..100) {
                0..25 => {
                    let want = rng.random_bool(0.8).then_some(bytes);
                    let hit = t.lookup_with_state(sid, salt, &tokens, want).unwrap();
                    assert_eq!(hit.cached_tokens, hit.full_page_tokens + hit.partial_page_tokens);
                    assert!(hit.cached_tokens <= hit.kv_cached_tokens);
                    match (&want, &hit.state) {
                        (Some(b), Some(st)) => {
                            assert_eq!((st.position, st.state_bytes), (hit.cached_tokens, *b));
                            assert!(st.position > 0);
                        }
                        (Some(_), None) => assert_eq!(hit.cached_tokens, 0),
                        (None, st) => {
                            assert!(st.is_none());
                            assert_eq!(hit.cached_tokens, hit.kv_cached_tokens);
                        }
                    }
                    let stored: std::collections::HashMap<u32, Vec<u32>> =
                        t.committed_pages().into_iter().map(|(id, _, toks)| (id, toks)).collect();
                    for (i, id) in hit.page_ids.iter().enumerate() {
                        let n = (hit.cached_tokens - i * PT).min(PT);
                        assert_eq!(stored[id][..n], tokens[i * PT..i * PT + n], "seed {seed} step {step}");
                    }
                    sessions[k].1.extend(&hit.page_ids);
                    sessions[k].2.extend(hit.state.iter().map(|x| x.slot));
                }
                25..45 => {
                    // The engine's flow: pages for the prompt, committed, then a snapshot.
                    let n = tokens.len().div_ceil(PT);
                    let ids = t.allocate(sid, n as u32).unwrap();
                    sessions[k].1.extend(&ids);
                    if ids.len() == n {
                        t.commit_with_tail(sid, salt, &tokens, &ids, rng.random_bool(0.7)).unwrap();
                    }
                    let a = t.allocate_state(sid, salt, &tokens, bytes, n_pages).unwrap();
                    if !a.page_ids.is_empty() {
                        assert_eq!(a.page_ids.len(), n_pages);
                        sessions[k].2.push(a.slot);
                        if rng.random_bool(0.9) {
                            t.commit_state(sid, a.slot).unwrap();
                        }
                    }
                }
                45..60 => {
                    // A snapshot without fresh pages (often refused: no KV pages).
                    let a = t.allocate_state(sid, salt, &tokens, bytes, n_pages).unwrap();
                    if !a.page_ids.is_empty() {
                        sessions[k].2.push(a.slot);
                        t.commit_state(sid, a.slot).unwrap();
                    }
                }
                60..70 => {
                    let n = rng.random_range(0..6);
                    let ids = t.allocate(sid, n).unwrap();
                    sessions[k].1.extend(&ids);
                }
                70..96 => {
                    let (_, pages, slots) = &mut sessions[k];
                    let np = rng.random_range(0..=pages.len());
                    let ns = rng.random_range(0..=slots.len());
                    let p: Vec<u32> = pages.drain(..np).collect();
                    let s: Vec<u32> = slots.drain(..ns).collect();
                    t.release_all(sid, &p, &s).unwrap();
                }
                _ => {
                    t.close_session(sid);
                    sessions.swap_remove(k);
                }
            }
            if let Err(e) = t.check_invariants() {
                panic!("seed {seed} step {step}: {e}");
            }
            let st = t.stats();
            assert!(st.pages_free + st.pages_pinned + st.state_pages <= st.pages_total);
        }
        for (sid, _, _) in sessions.drain(..) {
            t.close_session(sid);
        }
        t.check_invariants().unwrap();
        let st = t.stats();
        assert_eq!((st.pages_pinned, st.states_pinned), (0, 0), "seed {seed}");
        assert_eq!(st.pages_free + st.pages_cached + st.state_pages, st.pages_total, "seed {seed}");
        let c = st.counters;
        assert_eq!(
            c.tokens_hit_full_pages
                + c.tokens_hit_partial_pages
                + c.tokens_missed_no_match
                + c.tokens_missed_evicted
                + c.tokens_missed_salt_mismatch
                + c.tokens_missed_no_state
                + c.tokens_missed_last_token,
            c.prompt_tokens_queried,
            "seed {seed}: hits and misses must add up"
        );
        restores += c.state_restores;
        stored += c.states_committed;
        state_evictions += c.state_evictions;
        short += c.tokens_missed_no_state;
    }
    assert!(
        restores > 0 && stored > 0 && state_evictions > 0 && short > 0,
        "restores {restores} stored {stored} state evictions {state_evictions} no-state misses {short}"
    );
}
