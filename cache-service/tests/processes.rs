//! Real processes: an engine killed with SIGKILL leaks no page, and a cache-service killed
//! with SIGKILL is noticed by its engines and leaves a file the next start replaces.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cache_service::CacheClient;
use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};

const CHILD_ENV: &str = "EDGE_CACHE_TEST_CHILD_ENDPOINT";

fn shm_path(name: &str) -> PathBuf {
    let dir = if PathBuf::from("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    dir.join(format!("edge-cache-proc-{name}-{}", std::process::id()))
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Not a test on its own: the body of the engine process that `an_engine_killed_with_sigkill_leaks_nothing`
/// spawns (this test binary re-run with `--ignored --exact`). Without the env var it does nothing.
#[tokio::test]
#[ignore = "spawned as a child process by an_engine_killed_with_sigkill_leaks_nothing"]
async fn child_engine_holding_pages() {
    let Ok(endpoint) = std::env::var(CHILD_ENV) else {
        return;
    };
    let client = CacheClient::connect(&endpoint).await.unwrap();
    let session = client.attach("model-a", 8192, 16, "child").await.unwrap();
    let pages = session.allocate(7).await.unwrap();
    assert_eq!(pages.len(), 7);
    let tokens: Vec<u32> = (0..32).collect();
    assert_eq!(session.commit("", &tokens, &pages).await.unwrap(), 2);
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_killed_with_sigkill_leaks_nothing() {
    let arena =
        Arena::create(&ArenaOptions { path: shm_path("engine-kill"), file_bytes: 1 << 20, reserve: false }).unwrap();
    let cache = Cache::new(arena, 16);
    let listener = Listener::bind(&ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())).await.unwrap();
    let endpoint = listener.endpoint();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(cache.clone(), listener, AuthToken::none(), async move {
        let _ = stopped.await;
    }));

    let mut child: Child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_engine_holding_pages", "--nocapture"])
        .env(CHILD_ENV, &endpoint)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.trim() == "READY")
    });
    assert!(tokio::time::timeout(Duration::from_secs(60), ready).await.unwrap().unwrap(), "child never got ready");
    let s = cache.stats();
    assert_eq!((s.sessions, s.pages_pinned, s.pages_cached), (1, 7, 2));

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    wait_until("the killed engine's session to close", || async { cache.stats().sessions == 0 }).await;
    let s = cache.stats();
    assert_eq!((s.pages_pinned, s.pages_cached, s.pages_free), (0, 2, s.pages_total - 2));
    cache.check_invariants().unwrap();
    // The next engine finds the dead one's committed prefix warm.
    let client = CacheClient::connect(&endpoint).await.unwrap();
    let next = client.attach("model-a", 8192, 16, "next").await.unwrap();
    let prompt: Vec<u32> = (0..40).collect();
    let (pages, cached) = next.lookup("", &prompt).await.unwrap();
    assert_eq!((pages.len(), cached), (2, 32));
    drop(next);
    drop(client);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn_server(port: u16, shm_name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cache-service"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--arena-bytes", "1MiB", "--metrics-listen", ""])
        .args(["--shm-name", shm_name])
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap()
}

async fn connect_retrying(endpoint: &str) -> CacheClient {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match CacheClient::connect(endpoint).await {
            Ok(c) => return c,
            Err(e) => assert!(Instant::now() < deadline, "server never came up: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_notice_a_killed_cache_service_and_a_restart_replaces_its_arena() {
    let port = free_port();
    let name = format!("edge-cache-proc-restart-{}", std::process::id());
    let arena_file = PathBuf::from("/dev/shm").join(&name);
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut server = spawn_server(port, &name);
    let client = connect_retrying(&endpoint).await;
    let session = client.attach("model-a", 8192, 16, "engine").await.unwrap();
    assert_eq!(session.allocate(3).await.unwrap().len(), 3);
    assert!(session.is_alive());

    server.kill().unwrap();
    server.wait().unwrap();
    wait_until("the engine to notice", || async { !session.is_alive() }).await;
    assert!(arena_file.exists(), "SIGKILL leaves the arena file behind");
    drop(session);
    drop(client);

    let mut server = spawn_server(port, &name);
    let client = connect_retrying(&endpoint).await;
    let session = client.attach("model-a", 8192, 16, "engine").await.unwrap();
    let s = session.stats().await.unwrap();
    assert_eq!((s.pages_free, s.sessions), (s.pages_total, 1), "the restarted cache starts empty");
    drop(session);
    drop(client);

    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let status = server.wait().unwrap();
    assert!(status.success(), "graceful exit on SIGTERM: {status}");
    assert!(!arena_file.exists(), "a clean shutdown removes the arena file");
}
