//! Recurrent-state snapshots over the real gRPC server and client: bytes written by one
//! session through its mapping are read back by another, exactly at the snapshot position;
//! leases die with the session stream; the Stats RPC counts stores, restores and lookups
//! shortened for lack of a snapshot.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};
use cache_service::{CacheClient, CacheSession, StateAllocation};
use proto::cache::v1::MissReason;

const PAGE_BYTES: u64 = 4096;
const PAGE_TOKENS: u32 = 16;
/// Spans three 4 KiB pages, the last one in part.
const STATE_BYTES: u64 = 10_000;

fn state_bytes(seed: u8) -> Vec<u8> {
    (0..STATE_BYTES as usize).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn write_state(session: &CacheSession, pages: &[u32], bytes: &[u8]) {
    let mut at = 0;
    for (p, n) in session.state_chunks(pages, bytes.len() as u64).unwrap() {
        // SAFETY: the pages are leased writable to this session by AllocateState; n <= stride.
        unsafe { std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), p.as_ptr(), n) };
        at += n;
    }
    assert_eq!(at, bytes.len());
}

fn read_state(session: &CacheSession, pages: &[u32], len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (p, n) in session.state_chunks(pages, len).unwrap() {
        // SAFETY: the snapshot is pinned to this session and immutable; n <= stride.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(p.as_ptr(), n) });
    }
    out
}

/// Caches `tokens` (full pages and the partial tail) and releases the pages.
async fn cache_prompt(session: &CacheSession, salt: &str, tokens: &[u32]) {
    let n = tokens.len().div_ceil(PAGE_TOKENS as usize) as u32;
    let pages = session.allocate(n).await.unwrap();
    assert_eq!(pages.len(), n as usize);
    session.commit_with_tail(salt, tokens, &pages, true).await.unwrap();
    session.release(&pages).await.unwrap();
}

async fn save(session: &CacheSession, salt: &str, tokens: &[u32], seed: u8) -> bool {
    match session.allocate_state(salt, tokens, STATE_BYTES).await.unwrap() {
        StateAllocation::Leased { slot, page_ids } => {
            write_state(session, &page_ids, &state_bytes(seed));
            let ok = session.commit_state(slot).await.unwrap();
            session.release_all(&[], &[slot]).await.unwrap();
            ok
        }
        StateAllocation::AlreadyCached | StateAllocation::NoRoom => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_round_trip_between_sessions_and_die_with_their_leases() {
    let path: PathBuf =
        if PathBuf::from("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() }
            .join(format!("edge-cache-state-it-{}", std::process::id()));
    let arena = Arena::create(&ArenaOptions { path, file_bytes: 1 << 20, reserve: false }).unwrap();
    let cache = Cache::new(arena, PAGE_TOKENS);
    let listener = Listener::bind(&ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())).await.unwrap();
    let endpoint = listener.endpoint();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(cache.clone(), listener, AuthToken::none(), async move {
        let _ = stopped.await;
    }));

    let client = CacheClient::connect(&endpoint).await.unwrap();
    let writer = client.attach("hybrid", PAGE_BYTES, PAGE_TOKENS, "writer").await.unwrap();
    // Turn 1: a 40-token prompt (2 full pages + 8), snapshot at its end.
    let turn: Vec<u32> = (500..540).collect();
    cache_prompt(&writer, "", &turn).await;
    assert!(save(&writer, "", &turn, 7).await);
    // Saving it again leases nothing.
    assert_eq!(writer.allocate_state("", &turn, STATE_BYTES).await.unwrap(), StateAllocation::AlreadyCached);
    // The generation went on to 50 tokens, cached without a snapshot.
    let answered: Vec<u32> = (500..550).collect();
    cache_prompt(&writer, "", &answered).await;

    let reader = client.attach("hybrid", PAGE_BYTES, PAGE_TOKENS, "reader").await.unwrap();
    let next: Vec<u32> = (500..560).collect();
    let hit = reader.lookup_with_state("", &next, STATE_BYTES).await.unwrap();
    assert_eq!((hit.cached_tokens, hit.kv_cached_tokens), (40, 50));
    assert_eq!(hit.miss_reason, MissReason::NoStateSnapshot);
    assert_eq!(hit.page_ids.len(), 3);
    let st = hit.state.clone().expect("a snapshot at 40");
    assert_eq!((st.position, st.state_bytes, st.page_ids.len()), (40, STATE_BYTES, 3));
    assert_eq!(
        read_state(&reader, &st.page_ids, st.state_bytes),
        state_bytes(7),
        "snapshot bytes differ through the second mapping"
    );
    // Other salts and other models never see it.
    let other_salt = reader.lookup_with_state("tenant", &next, STATE_BYTES).await.unwrap();
    assert!(other_salt.state.is_none() && other_salt.page_ids.is_empty());
    let other_model = client.attach("other", PAGE_BYTES, PAGE_TOKENS, "other").await.unwrap();
    let miss = other_model.lookup_with_state("", &next, STATE_BYTES).await.unwrap();
    assert!(miss.state.is_none() && miss.cached_tokens == 0);
    drop(other_model);

    let s = reader.stats().await.unwrap();
    assert_eq!((s.state_snapshots_stored, s.state_restores, s.state_lookups), (1, 1, 3));
    assert_eq!(s.tokens_missed_no_state_snapshot, 10);
    assert_eq!((s.states_cached, s.states_pinned, s.state_pages), (1, 1, 3));
    assert_eq!(s.state_bytes_in_use, STATE_BYTES);
    // A state-less lookup of the same prompt takes all 50 KV tokens.
    let plain = reader.lookup_detailed("", &next).await.unwrap();
    assert_eq!((plain.cached_tokens, plain.state.is_none()), (50, true));
    reader.release(&plain.page_ids).await.unwrap();

    // The writer leases a snapshot and dies before committing it: the lease is freed.
    let leased = writer.allocate_state("", &answered, STATE_BYTES).await.unwrap();
    assert!(matches!(leased, StateAllocation::Leased { .. }));
    assert_eq!(reader.stats().await.unwrap().state_pages, 6);
    drop(writer);
    // The reader dies holding its pins: they go too.
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = client.stats().await.unwrap();
        if s.sessions == 0 {
            assert_eq!((s.state_pages, s.states_pinned, s.pages_pinned), (3, 0, 0));
            assert_eq!(s.states_cached, 1);
            break;
        }
        assert!(Instant::now() < deadline, "sessions never closed: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cache.check_invariants().unwrap();
    drop(client);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
