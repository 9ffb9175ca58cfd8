//! The accept loop against real sockets: floods of silent connections, slow headers, and a
//! full house of busy connections.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{ConnectionLimits, serve};

/// Starts `serve` on a free port with a tiny app behind the gateway's body reader: `/ok`
/// answers at once (GET or POST), `/slow` after 30 s.
async fn start(limits: ConnectionLimits) -> (String, tokio::sync::oneshot::Sender<()>) {
    let app = Router::new()
        .route("/ok", get(|| async { "ok" }).post(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            crate::routes::BodyRules { timeout: Duration::from_secs(60), limit: 1 << 20 },
            crate::routes::read_body_within,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, app, limits, async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// Sends a whole GET and returns the response text (the server closes after it).
async fn get_once(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap_or_default();
    String::from_utf8_lossy(&out).into_owned()
}

/// A connection that sends part of a request head and then nothing.
async fn silent(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /ok HTTP/1.1\r\nhost: t\r\nx-slow: ").await.unwrap();
    s
}

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_connections_does_not_starve_a_normal_client() {
    let limits = ConnectionLimits { max_connections: 8, header_read_timeout: Duration::from_secs(30) };
    let (addr, _stop) = start(limits).await;
    let mut flood = Vec::new();
    for round in 0..5 {
        // Each wave alone fills every slot.
        for _ in 0..8 {
            flood.push(silent(&addr).await);
        }
        let started = Instant::now();
        let response = get_once(&addr, "/ok").await;
        assert!(response.starts_with("HTTP/1.1 200"), "round {round}: {response:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "round {round} took {:?}", started.elapsed());
    }
    // The normal requests got their slots by closing the oldest silent connections.
    let mut evicted = 0;
    for s in flood.iter_mut().take(8) {
        evicted += usize::from(closed_within(s, Duration::from_millis(500)).await);
    }
    assert!(evicted > 0, "no silent connection was closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bodies_that_never_come_does_not_starve_a_normal_client() {
    let limits = ConnectionLimits { max_connections: 8, header_read_timeout: Duration::from_secs(30) };
    let (addr, _stop) = start(limits).await;
    let mut flood = Vec::new();
    for round in 0..5 {
        for _ in 0..8 {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(b"POST /ok HTTP/1.1\r\nhost: t\r\ncontent-length: 1000\r\n\r\n{").await.unwrap();
            flood.push(s);
        }
        let response = get_once(&addr, "/ok").await;
        assert!(response.starts_with("HTTP/1.1 200"), "round {round}: {response:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_do_not_arrive_in_time_close_the_connection() {
    let limits = ConnectionLimits { max_connections: 64, header_read_timeout: Duration::from_millis(300) };
    let (addr, _stop) = start(limits).await;
    let mut s = silent(&addr).await;
    let started = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await, "a silent connection stayed open");
    assert!(started.elapsed() >= Duration::from_millis(250), "closed before its deadline: {:?}", started.elapsed());
    // A prompt client on the same server is unaffected.
    assert!(get_once(&addr, "/ok").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_limit_with_every_connection_busy_is_a_quick_503() {
    let limits = ConnectionLimits { max_connections: 2, header_read_timeout: Duration::from_secs(30) };
    let (addr, _stop) = start(limits).await;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
        busy.push(s);
    }
    // Both requests reached the app (their connections are no longer evictable).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let response = get_once(&addr, "/ok").await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response:?}");
    assert!(response.contains("\"code\":\"too_many_connections\""), "{response:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // The busy connections were left alone.
    for s in &mut busy {
        assert!(!closed_within(s, Duration::from_millis(100)).await, "a busy connection was closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_request_in_flight_finish() {
    let app = Router::new().route(
        "/wait",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "done"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = ConnectionLimits { max_connections: 8, header_read_timeout: Duration::from_secs(30) };
    let server = tokio::spawn(serve(listener, app, limits, async move {
        let _ = stopped.await;
    }));
    let request = tokio::spawn({
        let addr = addr.clone();
        async move { get_once(&addr, "/wait").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    let response = request.await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200") && response.ends_with("done"), "{response:?}");
    tokio::time::timeout(Duration::from_secs(5), server).await.expect("serve returns after draining").unwrap().unwrap();
    assert!(TcpStream::connect(&addr).await.is_err(), "still accepting after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_read_and_answered_413_not_reset() {
    let limits = ConnectionLimits { max_connections: 8, header_read_timeout: Duration::from_secs(30) };
    let (addr, _stop) = start(limits).await;
    // 4 MiB against a 1 MiB limit: the client is still sending when the answer is known.
    let body = vec![b' '; 4 << 20];
    for _ in 0..3 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let head =
            format!("POST /ok HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&body).await.expect("the whole body is taken");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("the answer arrives, no reset");
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 413"), "{text:?}");
    }
}
