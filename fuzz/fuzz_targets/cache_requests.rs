//! The cache-service's table operations driven by arbitrary protos, as engines send them:
//! `Lookup`, `Allocate`, `Commit`, `Release`, `AllocateState`, `CommitState`, against a real
//! `Cache` over a small arena with two attached sessions (a request names one of them, or
//! an unknown session). After every call the tables' invariants hold (refcounts match the
//! leases, the LRU holds exactly the unreferenced pages, ...); at the end, with both
//! sessions gone, no page or snapshot is referenced any more.
//! Input: records of `tag (1 byte) | length (1 byte) | proto bytes`.
#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::{AttachParams, Cache};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use proto::cache::v1 as pb;

static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
static RUN: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let path = DIR.get_or_init(|| common::scratch_dir("cache")).join(format!("arena-{}", RUN.fetch_add(1, Ordering::Relaxed)));
    let arena = Arena::create(&ArenaOptions { path: path.clone(), file_bytes: 4096 + 24 * 4096, reserve: false })
        .expect("arena");
    let cache = Cache::new(arena, 4);
    let params = |name: &str| AttachParams {
        model_fingerprint: "fuzz".into(),
        page_bytes: 1024,
        page_tokens: 4,
        engine_name: name.into(),
    };
    let (a, _) = cache.attach(&params("a")).expect("attach a");
    let (b, _) = cache.attach(&params("b")).expect("attach b");
    let sessions = [a.session_id(), b.session_id()];
    let session = |raw: u64| match raw % 3 {
        0 => sessions[0],
        1 => sessions[1],
        _ => raw,
    };
    let mut rest = data;
    while let [tag, len, tail @ ..] = rest {
        let n = (*len as usize).min(tail.len());
        let (msg, next) = tail.split_at(n);
        rest = next;
        match tag % 6 {
            0 => {
                let Ok(r) = pb::LookupRequest::decode(msg) else { continue };
                let want = r.want_state.then_some(r.state_bytes);
                let _ = cache.lookup_with_state(session(r.session_id), &r.cache_salt, &r.token_ids, want);
            }
            1 => {
                let Ok(r) = pb::AllocateRequest::decode(msg) else { continue };
                let _ = cache.allocate(session(r.session_id), r.count.min(64));
            }
            2 => {
                let Ok(r) = pb::CommitRequest::decode(msg) else { continue };
                let _ = cache.commit(session(r.session_id), &r.cache_salt, &r.token_ids, &r.page_ids, r.include_partial_tail);
            }
            3 => {
                let Ok(r) = pb::ReleaseRequest::decode(msg) else { continue };
                let _ = cache.release_all(session(r.session_id), &r.page_ids, &r.state_slots);
            }
            4 => {
                let Ok(r) = pb::AllocateStateRequest::decode(msg) else { continue };
                let _ = cache.allocate_state(session(r.session_id), &r.cache_salt, &r.token_ids, r.state_bytes);
            }
            _ => {
                let Ok(r) = pb::CommitStateRequest::decode(msg) else { continue };
                let _ = cache.commit_state(session(r.session_id), r.slot);
            }
        }
        if let Err(e) = cache.check_invariants() {
            panic!("invariants broken after op {tag}: {e}");
        }
    }
    drop((a, b));
    if let Err(e) = cache.check_invariants() {
        panic!("invariants broken after the sessions closed: {e}");
    }
    drop(cache);
    let _ = std::fs::remove_file(path);
});
