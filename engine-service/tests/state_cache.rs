//! Recurrent-state snapshots through a real cache-service (its gRPC server and shared-memory
//! arena, started in this process) with the engine's `PageStore` API, as the step loop
//! calls it: snapshots come back at exactly their position with the same bytes, a longer KV
//! prefix is cut back to the last snapshot, another salt or model fingerprint never hits,
//! and without a cache-service nothing is saved or served.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};
use engine_service::memory::KvLayout;
use engine_service::memory::state::{SaveOutcome, lookup_prefix};
use engine_service::memory::store::{AttachSpec, CacheLink, LeasedPage, PageStore};

const PT: usize = 16;
/// Not a multiple of the arena's page stride: the last page is used in part.
const STATE_BYTES: usize = 3 * 4096 + 123;

fn layout() -> KvLayout {
    KvLayout { n_layers: 2, n_kv_heads: 1, head_dim: 8, page_tokens: PT, dtype: engine_service::memory::KvDtype::F16 }
}

fn state(seed: u8) -> Vec<u8> {
    (0..STATE_BYTES).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 1000 + (i * 37) % 3000).collect()
}

struct Server {
    runtime: tokio::runtime::Runtime,
    endpoint: String,
    cache: Arc<Cache>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    fn start() -> Server {
        static N: AtomicU32 = AtomicU32::new(0);
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = if PathBuf::from("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let path = dir.join(format!("edge-engine-state-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let arena = Arena::create(&ArenaOptions { path, file_bytes: 4 << 20, reserve: false }).unwrap();
        let cache = Cache::new(arena, PT as u32);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let endpoint = runtime.block_on(async {
            let listener = Listener::bind(&ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())).await.unwrap();
            let endpoint = listener.endpoint();
            tokio::spawn(serve(cache.clone(), listener, AuthToken::none(), async move {
                let _ = stopped.await;
            }));
            endpoint
        });
        Server { runtime, endpoint, cache, stop: Some(stop) }
    }

    /// A store linked to a fresh session of this server under `fingerprint`.
    fn store(&self, fingerprint: &str) -> (PageStore, Arc<CacheLink>) {
        let layout = layout();
        let spec = AttachSpec {
            auth: AuthToken::none(),
            endpoint: self.endpoint.clone(),
            fingerprint: fingerprint.to_string(),
            page_bytes: layout.page_bytes() as u64,
            page_tokens: PT as u32,
        };
        let session = self.runtime.block_on(spec.attach()).unwrap();
        let link = CacheLink::new();
        link.set(Arc::new(session));
        (PageStore::linked(layout, 8, link.clone(), self.runtime.handle().clone()), link)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What the step loop does at the end of a prompt or a generation: pages for `toks`
/// committed (with the partial tail), then the state after `toks` saved, then the pages
/// released.
fn run_and_snapshot(store: &mut PageStore, salt: &str, toks: &[u32], snapshot: Option<&[u8]>) -> Option<SaveOutcome> {
    let pages: Vec<LeasedPage> = store.allocate(toks.len().div_ceil(PT)).unwrap().unwrap();
    store.commit(salt, toks, &pages, true);
    let outcome = snapshot.map(|bytes| store.save_state(salt, toks, bytes).unwrap());
    store.release(&pages);
    store.flush();
    outcome
}

#[test]
fn a_snapshot_comes_back_at_its_exact_position_with_the_same_bytes() {
    let server = Server::start();
    let (mut store, _link) = server.store("hybrid-a");
    let convo = tokens(120);
    // Turn 1: a 37-token prompt (2 full pages + 5), snapshot at its end.
    let p = 37;
    assert_eq!(run_and_snapshot(&mut store, "", &convo[..p], Some(&state(1))), Some(SaveOutcome::Stored));
    assert_eq!(store.save_state("", &convo[..p], &state(1)).unwrap(), SaveOutcome::AlreadyCached);

    // Turn 2 extends it: exactly P tokens come back, with the same bytes.
    let prefix = store.lookup_with_state("", &convo[..60], STATE_BYTES).unwrap();
    assert_eq!((prefix.cached_tokens, prefix.kv_cached_tokens), (p, p));
    assert_eq!(prefix.partial_page_tokens, p % PT);
    assert_eq!(prefix.pages.len(), p.div_ceil(PT));
    let lease = prefix.state.as_ref().expect("a snapshot at 37");
    assert!(store.is_state_usable(lease));
    assert_eq!((lease.position, lease.state_bytes), (p, STATE_BYTES));
    assert_eq!(lease.to_vec(), state(1));
    store.release_state(lease);
    store.release(&prefix.pages);

    // The generation went on to 52 tokens whose pages are cached, but the state after them
    // was not saved: a prompt sharing all 52 still resumes from the snapshot at 37.
    run_and_snapshot(&mut store, "", &convo[..52], None);
    let prefix = store.lookup_with_state("", &convo[..80], STATE_BYTES).unwrap();
    assert_eq!((prefix.cached_tokens, prefix.kv_cached_tokens), (p, 52));
    assert_eq!(prefix.state.as_ref().map(|s| s.position), Some(p));
    store.release_state(prefix.state.as_ref().unwrap());
    store.release(&prefix.pages);

    // With a snapshot at 52 (end of generation) that one is served, and a prompt diverging
    // at 45 falls back to the one at 37.
    assert_eq!(run_and_snapshot(&mut store, "", &convo[..52], Some(&state(2))), Some(SaveOutcome::Stored));
    let prefix = store.lookup_with_state("", &convo[..80], STATE_BYTES).unwrap();
    let lease = prefix.state.as_ref().unwrap();
    assert_eq!((prefix.cached_tokens, lease.position), (52, 52));
    assert_eq!(lease.to_vec(), state(2));
    store.release_state(lease);
    store.release(&prefix.pages);
    let mut diverged = convo[..45].to_vec();
    diverged.extend([7, 8, 9, 10]);
    let prefix = store.lookup_with_state("", &diverged, STATE_BYTES).unwrap();
    assert_eq!((prefix.cached_tokens, prefix.kv_cached_tokens), (p, 45));
    assert_eq!(prefix.state.as_ref().unwrap().to_vec(), state(1));
    store.release_state(prefix.state.as_ref().unwrap());
    store.release(&prefix.pages);

    // A prompt shorter than the first snapshot gets nothing (its KV alone is not usable).
    let prefix = store.lookup_with_state("", &convo[..30], STATE_BYTES).unwrap();
    assert!(prefix.state.is_none() && prefix.pages.is_empty() && prefix.cached_tokens == 0);
    assert_eq!(prefix.kv_cached_tokens, 29);
    // A state-less lookup (attention-only model) is the plain KV lookup.
    let plain = store.lookup_with_state("", &convo[..80], 0).unwrap();
    assert_eq!((plain.cached_tokens, plain.state.is_none()), (52, true));
    store.release(&plain.pages);
    store.flush();

    let stats = server.runtime.block_on(async {
        cache_service::CacheClient::connect(&server.endpoint).await.unwrap().stats().await.unwrap()
    });
    assert_eq!((stats.state_snapshots_stored, stats.state_restores), (2, 4));
    assert_eq!(stats.tokens_missed_no_state_snapshot, (52 - 37) + (45 - 37) + 29);
    assert_eq!((stats.pages_pinned, stats.states_pinned), (0, 0));
    server.cache.check_invariants().unwrap();
}

#[test]
fn other_salts_and_fingerprints_never_hit_a_snapshot() {
    let server = Server::start();
    let (mut a, _la) = server.store("hybrid-a");
    let convo = tokens(64);
    assert_eq!(run_and_snapshot(&mut a, "tenant-1", &convo[..40], Some(&state(3))), Some(SaveOutcome::Stored));
    for salt in ["", "tenant-2"] {
        let prefix = a.lookup_with_state(salt, &convo, STATE_BYTES).unwrap();
        assert!(prefix.state.is_none() && prefix.pages.is_empty(), "salt {salt:?}");
    }
    let (mut b, link_b) = server.store("hybrid-b");
    let prefix = b.lookup_with_state("tenant-1", &convo, STATE_BYTES).unwrap();
    assert!(prefix.state.is_none() && prefix.cached_tokens == 0);
    // The async form the gRPC handler uses sees the same.
    let (generation, session) = link_b.current().unwrap();
    let prefix = server.runtime.block_on(lookup_prefix(&session, generation, "tenant-1", &convo, STATE_BYTES)).unwrap();
    assert!(prefix.state.is_none());
    // The owner's salt and fingerprint hit.
    let prefix = a.lookup_with_state("tenant-1", &convo, STATE_BYTES).unwrap();
    assert_eq!(prefix.state.as_ref().map(|s| s.position), Some(40));
    assert_eq!(prefix.state.as_ref().unwrap().to_vec(), state(3));
}

#[test]
fn a_snapshot_without_its_kv_pages_is_not_published() {
    let server = Server::start();
    let (mut store, _link) = server.store("hybrid-a");
    let convo = tokens(64);
    // Saved before (and without) committing the pages of its prefix.
    assert_eq!(store.save_state("", &convo[..40], &state(4)).unwrap(), SaveOutcome::Stored);
    store.flush();
    let prefix = store.lookup_with_state("", &convo, STATE_BYTES).unwrap();
    assert!(prefix.state.is_none());
    let stats = server.runtime.block_on(async {
        cache_service::CacheClient::connect(&server.endpoint).await.unwrap().stats().await.unwrap()
    });
    assert_eq!((stats.state_snapshots_stored, stats.state_pages), (0, 0));
}

#[test]
fn without_a_cache_service_nothing_is_saved_or_served() {
    let mut store = PageStore::local(layout(), 8);
    let convo = tokens(40);
    assert_eq!(run_and_snapshot(&mut store, "", &convo[..20], Some(&state(5))), Some(SaveOutcome::Uncached));
    let prefix = store.lookup_with_state("", &convo, STATE_BYTES).unwrap();
    assert!(prefix.state.is_none() && prefix.pages.is_empty() && prefix.cached_tokens == 0);
}
