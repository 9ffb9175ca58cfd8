//! Measures cache RPC latency over loopback TCP with an in-process server: Lookup of an
//! agentic-size prompt (24,000 tokens = 1,500 cached pages), its Release, and a small
//! Allocate + Release. Run: `cargo run --release -p cache-service --example lookup_latency`.

use std::time::{Duration, Instant};

use cache_service::CacheClient;
use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};

const PROMPT_TOKENS: usize = 24_000;
const PAGE_TOKENS: u32 = 16;
const ITERS: usize = 200;

fn summary(name: &str, mut d: Vec<Duration>) {
    d.sort();
    let at = |q: f64| d[((d.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!("{name:<28} p50 {:>8.1} µs   p90 {:>8.1} µs   p99 {:>8.1} µs", at(0.5), at(0.9), at(0.99));
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::path::Path::new("/dev/shm").join(format!("edge-cache-bench-{}", std::process::id()));
    let arena = Arena::create(&ArenaOptions { path, file_bytes: 64 << 20, reserve: false })?;
    let cache = Cache::new(arena, PAGE_TOKENS);
    let listener = Listener::bind(&ListenAddr::Tcp("127.0.0.1:0".parse()?)).await?;
    let endpoint = listener.endpoint();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(cache.clone(), listener, AuthToken::none(), async move {
        let _ = stopped.await;
    }));

    let client = CacheClient::connect(&endpoint).await?;
    // Page bytes do not change RPC cost; small pages keep the arena small.
    let session = client.attach("bench-model", 4096, PAGE_TOKENS, "bench").await?;
    let tokens: Vec<u32> = (0..PROMPT_TOKENS as u32).map(|i| i.wrapping_mul(2_654_435_761) % 49_152).collect();
    let pages = session.allocate((PROMPT_TOKENS / PAGE_TOKENS as usize) as u32).await?;
    let t = Instant::now();
    let published = session.commit("", &tokens, &pages).await?;
    println!("commit of {published} pages ({PROMPT_TOKENS} tokens): {:.1} µs", t.elapsed().as_secs_f64() * 1e6);
    session.release(&pages).await?;

    let mut next_turn = tokens.clone();
    next_turn.extend(1..=40);
    let (mut lookups, mut releases, mut small) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ITERS {
        let t = Instant::now();
        let (hit, cached) = session.lookup("", &next_turn).await?;
        lookups.push(t.elapsed());
        assert_eq!(cached, PROMPT_TOKENS);
        let t = Instant::now();
        session.release(&hit).await?;
        releases.push(t.elapsed());
        let t = Instant::now();
        let fresh = session.allocate(4).await?;
        session.release(&fresh).await?;
        small.push(t.elapsed());
    }
    // The same lookup without gRPC: the table work alone.
    let mut direct = Vec::new();
    for _ in 0..ITERS {
        let t = Instant::now();
        let hit = cache.lookup(session.session_id(), "", &next_turn)?;
        direct.push(t.elapsed());
        cache.release(session.session_id(), &hit.page_ids)?;
    }
    summary("lookup 24K tokens (hit)", lookups);
    summary("  of which table work", direct);
    summary("release 1500 pages", releases);
    summary("allocate 4 + release 4", small);
    drop(session);
    let _ = stop.send(());
    server.await??;
    Ok(())
}
