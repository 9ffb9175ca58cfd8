//! In-process integration: the real tonic server on a random port (or a Unix socket), the
//! real client, KV bytes through the shared mapping.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};
use cache_service::{CacheClient, CacheError, CacheSession};
use proto::cache::v1::StatsResponse;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const PAGE_BYTES: u64 = 10_000;
const PAGE_TOKENS: u32 = 16;

struct TestServer {
    endpoint: String,
    arena_path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), CacheError>>,
}

fn unique(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("edge-cache-it-{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn shm_dir() -> PathBuf {
    let dev_shm = PathBuf::from("/dev/shm");
    if dev_shm.is_dir() { dev_shm } else { std::env::temp_dir() }
}

async fn start(name: &str, listen: ListenAddr, arena_bytes: u64) -> TestServer {
    let arena_path = shm_dir().join(unique(name));
    let arena =
        Arena::create(&ArenaOptions { path: arena_path.clone(), file_bytes: arena_bytes, reserve: false }).unwrap();
    let cache = Cache::new(arena, PAGE_TOKENS);
    let listener = Listener::bind(&listen).await.unwrap();
    let endpoint = listener.endpoint();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(cache, listener, AuthToken::none(), async move {
        let _ = rx.await;
    }));
    TestServer { endpoint, arena_path, stop: Some(tx), task }
}

async fn start_tcp(name: &str) -> TestServer {
    start(name, ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()), 1 << 20).await
}

impl TestServer {
    async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task).await.expect("server drains").unwrap().unwrap();
    }
}

async fn wait_for_stats(client: &CacheClient, what: &str, pred: impl Fn(&StatsResponse) -> bool) -> StatsResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = client.stats().await.unwrap();
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; last stats {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn fill_page(session: &CacheSession, page: u32, seed: u8) {
    let p = session.page_ptr(page).unwrap();
    let bytes: Vec<u8> = (0..PAGE_BYTES as usize).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    // SAFETY: the page is leased writable to this session and PAGE_BYTES <= stride.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.as_ptr(), bytes.len()) };
}

fn read_page(session: &CacheSession, page: u32) -> Vec<u8> {
    let p = session.page_ptr(page).unwrap();
    // SAFETY: committed pages are immutable and lie inside the mapping.
    unsafe { std::slice::from_raw_parts(p.as_ptr(), PAGE_BYTES as usize) }.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_session_reads_the_kv_bytes_the_first_committed() {
    let server = start_tcp("share").await;
    let client = CacheClient::connect(&server.endpoint).await.unwrap();
    let writer = client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "writer").await.unwrap();
    assert_eq!(writer.page_tokens(), 16);
    assert_eq!(writer.page_stride(), 12_288);
    let total = writer.page_count();
    assert!(writer.page_ptr(total).is_err());

    let tokens: Vec<u32> = (100..140).collect(); // 2 full pages + 8 tokens
    let (hit, cached) = writer.lookup("", &tokens).await.unwrap();
    assert!(hit.is_empty() && cached == 0);
    let pages = writer.allocate(3).await.unwrap();
    assert_eq!(pages.len(), 3);
    for (i, &p) in pages.iter().enumerate() {
        fill_page(&writer, p, i as u8);
    }
    assert_eq!(writer.commit("", &tokens, &pages).await.unwrap(), 2);

    let reader_client = CacheClient::connect(&server.endpoint).await.unwrap();
    let reader = reader_client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "reader").await.unwrap();
    let mut next_turn = tokens.clone();
    next_turn.extend([1, 2, 3]);
    let (hit, cached) = reader.lookup("", &next_turn).await.unwrap();
    assert_eq!(hit, pages[..2].to_vec());
    assert_eq!(cached, 32);
    for (i, &p) in hit.iter().enumerate() {
        let expected: Vec<u8> =
            (0..PAGE_BYTES as usize).map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8)).collect();
        assert_eq!(read_page(&reader, p), expected, "page {i} bytes differ through the second mapping");
    }
    // Another tenant salt or model sees nothing.
    assert_eq!(reader.lookup("tenant-b", &next_turn).await.unwrap().1, 0);
    let other_model = reader_client.attach("model-b", PAGE_BYTES, PAGE_TOKENS, "other").await.unwrap();
    assert_eq!(other_model.lookup("", &next_turn).await.unwrap().1, 0);
    drop(other_model);

    let s = reader.stats().await.unwrap();
    assert_eq!((s.pages_cached, s.pages_pinned, s.pages_free), (2, 3, total - 3));
    assert_eq!(s.lookups, 4);
    assert_eq!(s.tokens_hit_full_pages, 32);

    // The writer goes away holding 2 committed pages and 1 writable page: the writable one is
    // freed, the committed ones stay cached (still pinned by the reader).
    drop(writer);
    drop(client);
    let s = wait_for_stats(&reader_client, "the writer's session to close", |s| s.sessions == 1).await;
    assert_eq!((s.pages_cached, s.pages_pinned, s.pages_free), (2, 2, total - 2));
    reader.release(&hit).await.unwrap();
    let s = reader.stats().await.unwrap();
    assert_eq!((s.pages_cached, s.pages_pinned), (2, 0));
    drop(reader);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_session_frees_its_uncommitted_pages() {
    let server = start_tcp("drop").await;
    let observer = CacheClient::connect(&server.endpoint).await.unwrap();
    {
        let client = CacheClient::connect(&server.endpoint).await.unwrap();
        let session = client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "doomed").await.unwrap();
        let pages = session.allocate(5).await.unwrap();
        assert_eq!(pages.len(), 5);
        let s = observer.stats().await.unwrap();
        assert_eq!((s.pages_free, s.pages_pinned, s.sessions), (s.pages_total - 5, 5, 1));
        // Dropping both the session and its client: the engine process going away.
    }
    let s = wait_for_stats(&observer, "the dropped session's pages to be freed", |s| s.sessions == 0).await;
    assert_eq!((s.pages_free, s.pages_pinned, s.pages_cached), (s.pages_total, 0, 0));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_get_status_codes_not_panics() {
    let server = start_tcp("codes").await;
    let client = CacheClient::connect(&server.endpoint).await.unwrap();
    let session = client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "e").await.unwrap();
    let code = |e: CacheError| match e {
        CacheError::Status(s) => s.code(),
        other => panic!("expected a status, got {other}"),
    };
    assert_eq!(code(session.release(&[1_000_000]).await.unwrap_err()), tonic::Code::InvalidArgument);
    assert_eq!(code(session.release(&[0]).await.unwrap_err()), tonic::Code::InvalidArgument);
    assert_eq!(code(session.commit("", &[1; 16], &[3]).await.unwrap_err()), tonic::Code::InvalidArgument);
    // An allocation larger than the arena is a value (empty), not an error.
    assert!(session.allocate(1_000_000).await.unwrap().is_empty());
    // A model with smaller pages shares the arena (same stride); a larger one while a session
    // is attached is refused.
    let smaller = client.attach("model-small", PAGE_BYTES / 2, PAGE_TOKENS, "small").await.unwrap();
    assert_eq!(smaller.page_stride(), session.page_stride());
    drop(smaller);
    let err = client.attach("model-a", PAGE_BYTES * 4, PAGE_TOKENS, "bigger").await.unwrap_err();
    assert_eq!(code(err), tonic::Code::FailedPrecondition);
    let err = client.attach("model-a", 0, PAGE_TOKENS, "zero").await.unwrap_err();
    assert_eq!(code(err), tonic::Code::InvalidArgument);
    // Once nobody is attached, the arena is re-formatted for the new layout.
    drop(session);
    wait_for_stats(&client, "the session to close", |s| s.sessions == 0).await;
    let bigger = client.attach("model-a", PAGE_BYTES * 4, 32, "bigger").await.unwrap();
    assert_eq!((bigger.page_stride(), bigger.page_tokens()), (40_960, 32));
    drop(bigger);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_endpoint_works_and_shutdown_ends_sessions() {
    let dir = tempfile::tempdir().unwrap();
    // A missing runtime directory is made (0700) by the server.
    let sock = dir.path().join("run/cache.sock");
    let server = start("unix", ListenAddr::Unix(sock.clone()), 1 << 20).await;
    assert_eq!(server.endpoint, format!("unix:{}", sock.display()));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
    let client = CacheClient::connect(&server.endpoint).await.unwrap();
    let session = client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "unix").await.unwrap();
    assert_eq!(session.allocate(2).await.unwrap().len(), 2);
    assert!(session.is_alive());
    let arena_path = server.arena_path.clone();
    assert!(arena_path.exists());
    server.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while session.is_alive() {
        assert!(Instant::now() < deadline, "the session did not notice the shutdown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!sock.exists(), "the socket file is removed on shutdown");
    drop(session);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while arena_path.exists() {
        assert!(Instant::now() < deadline, "the arena file was not removed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_tail_travels_through_grpc_and_other_salts_miss_it() {
    let server = start_tcp("partial").await;
    let client = CacheClient::connect(&server.endpoint).await.unwrap();
    let writer = client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "writer").await.unwrap();
    // 40 tokens: two full pages and an 8-token tail, published with the tail.
    let tokens: Vec<u32> = (0..40).map(|i| 500 + i).collect();
    let pages = writer.allocate(3).await.unwrap();
    for (i, &p) in pages.iter().enumerate() {
        fill_page(&writer, p, i as u8);
    }
    let published = writer.commit_with_tail("", &tokens, &pages, true).await.unwrap();
    assert_eq!(published, 3);
    writer.release(&pages).await.unwrap();

    let reader = client.attach("model-a", PAGE_BYTES, PAGE_TOKENS, "reader").await.unwrap();
    let mut next = tokens.clone();
    next.extend([1, 2, 3]);
    let hit = reader.lookup_detailed("", &next).await.unwrap();
    assert_eq!((hit.cached_tokens, hit.full_page_tokens, hit.partial_page_tokens), (40, 32, 8));
    assert_eq!(hit.page_ids, pages);
    let expected: Vec<u8> = (0..PAGE_BYTES as usize).map(|i| (i as u8).wrapping_mul(31).wrapping_add(2)).collect();
    assert_eq!(read_page(&reader, hit.page_ids[2]), expected);
    // The whole-page API drops the partial page (and releases it); the service still
    // counted the partial hit of that lookup.

    let (whole, n) = reader.lookup("", &next).await.unwrap();
    assert_eq!((whole.len(), n), (2, 32));
    let other = reader.lookup_detailed("tenant-b", &next).await.unwrap();
    assert_eq!(other.cached_tokens, 0);
    assert_eq!(other.miss_reason, proto::cache::v1::MissReason::SaltMismatch);
    reader.release(&hit.page_ids).await.unwrap();
    reader.release(&whole).await.unwrap();
    let s = client.stats().await.unwrap();
    assert_eq!((s.tokens_hit_partial_pages, s.pages_partial), (16, 1));
    assert_eq!(s.tokens_missed_salt_mismatch, 42);
    assert_eq!(s.pages_pinned, 0);
    assert_eq!(s.pages_used, s.pages_total - s.pages_free);
    assert!(s.lookup_ns_total > 0 && s.commit_ns_total > 0);
    drop((writer, reader));
    server.shutdown().await;
}
