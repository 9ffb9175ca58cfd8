//! Recurrent-state snapshot save and restore through the real gRPC server and the shared
//! arena, at the snapshot sizes of Qwen3.5-0.8B and Qwen3.6-27B (the engine's CPU backend
//! layout: fp32 conv window of K-1 = 3 columns + fp32 delta-rule state per Gated DeltaNet
//! layer). Save = AllocateState + copy in + CommitState/Release; restore = Lookup with state
//! + copy out + Release. The arena holds a few snapshots, so steady-state saves evict.
//!
//! `cargo run --release -p cache-service --example state_latency [-- rounds]`

use std::time::{Duration, Instant};

use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::ListenAddr;
use cache_service::server::{AuthToken, Listener, serve};
use cache_service::{CacheClient, CacheSession, StateAllocation};

const PAGE_TOKENS: u32 = 16;
const PREFIX: usize = 64;

struct Model {
    name: &'static str,
    /// KV bytes of one 16-token page (full-attention layers only, f16).
    page_bytes: u64,
    state_bytes: u64,
}

fn models() -> [Model; 2] {
    // conv_dim * 3 + Hv * 128 * 128 fp32 values per linear-attention layer.
    let state = |layers: u64, conv_dim: u64, hv: u64| layers * (conv_dim * 3 + hv * 128 * 128) * 4;
    [
        Model {
            name: "Qwen3.5-0.8B (18 GDN layers)",
            page_bytes: 6 * 2 * 2 * 256 * 2 * u64::from(PAGE_TOKENS),
            state_bytes: state(18, 6144, 16),
        },
        Model {
            name: "Qwen3.6-27B (48 GDN layers)",
            page_bytes: 16 * 2 * 4 * 256 * 2 * u64::from(PAGE_TOKENS),
            state_bytes: state(48, 10240, 48),
        },
    ]
}

fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

async fn save(s: &CacheSession, tokens: &[u32], bytes: &[u8]) -> (Duration, Duration, Duration) {
    let t0 = Instant::now();
    let StateAllocation::Leased { slot, page_ids } =
        s.allocate_state("", tokens, bytes.len() as u64).await.expect("allocate_state")
    else {
        panic!("no room for a snapshot");
    };
    let t1 = Instant::now();
    let mut at = 0;
    for (p, n) in s.state_chunks(&page_ids, bytes.len() as u64).expect("chunks") {
        // SAFETY: pages leased writable to this session; n <= stride.
        unsafe { std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), p.as_ptr(), n) };
        at += n;
    }
    let t2 = Instant::now();
    assert!(s.commit_state(slot).await.expect("commit_state"));
    s.release_all(&[], &[slot]).await.expect("release");
    (t1 - t0, t2 - t1, t2.elapsed())
}

async fn restore(s: &CacheSession, tokens: &[u32], out: &mut [u8]) -> (Duration, Duration) {
    let t0 = Instant::now();
    let hit = s.lookup_with_state("", tokens, out.len() as u64).await.expect("lookup");
    let st = hit.state.expect("a snapshot");
    let t1 = Instant::now();
    let mut at = 0;
    for (p, n) in s.state_chunks(&st.page_ids, st.state_bytes).expect("chunks") {
        // SAFETY: the snapshot is pinned and immutable; n <= stride.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), out[at..].as_mut_ptr(), n) };
        at += n;
    }
    let t2 = Instant::now();
    s.release_all(&hit.page_ids, &[st.slot]).await.expect("release");
    (t1 - t0, t2 - t1)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(12);
    for m in models() {
        let stride = m.page_bytes.div_ceil(4096) * 4096;
        let state_pages = m.state_bytes.div_ceil(stride);
        // Room for 3 snapshots plus the KV pages of a few prefixes.
        let arena_bytes = 4096 + stride * (3 * state_pages + 64);
        let arena = Arena::create(&ArenaOptions {
            path: std::path::PathBuf::from("/dev/shm").join(format!("edge-state-latency-{}", std::process::id())),
            file_bytes: arena_bytes,
            reserve: true,
        })
        .expect("arena");
        let cache = Cache::new(arena, PAGE_TOKENS);
        let listener = Listener::bind(&ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())).await.expect("listen");
        let endpoint = listener.endpoint();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(cache.clone(), listener, AuthToken::none(), async move {
            let _ = stopped.await;
        }));
        let client = CacheClient::connect(&endpoint).await.expect("connect");
        let s = client.attach("bench", m.page_bytes, PAGE_TOKENS, "bench").await.expect("attach");
        let bytes: Vec<u8> = (0..m.state_bytes as usize).map(|i| i as u8).collect();
        let mut out = vec![0u8; bytes.len()];
        let (mut alloc, mut copy_in, mut commit, mut lookup, mut copy_out) = (vec![], vec![], vec![], vec![], vec![]);
        for round in 0..rounds + 2 {
            // A fresh prefix per round: its KV pages, then its snapshot.
            let tokens: Vec<u32> = (0..PREFIX as u32).map(|i| i + 1000 * round as u32).collect();
            let pages = s.allocate((PREFIX / PAGE_TOKENS as usize) as u32).await.expect("pages");
            s.commit("", &tokens, &pages).await.expect("commit");
            s.release(&pages).await.expect("release");
            let (a, c, k) = save(&s, &tokens, &bytes).await;
            let mut longer = tokens.clone();
            longer.push(7);
            let (l, o) = restore(&s, &longer, &mut out).await;
            assert!(out == bytes, "restored bytes differ");
            if round >= 2 {
                alloc.push(a);
                copy_in.push(c);
                commit.push(k);
                lookup.push(l);
                copy_out.push(o);
            }
        }
        let st = s.stats().await.expect("stats");
        println!(
            "{}: {:.1} MiB per snapshot ({} pages of {} KiB); {rounds} rounds, {} snapshots evicted",
            m.name,
            m.state_bytes as f64 / (1 << 20) as f64,
            state_pages,
            stride / 1024,
            st.state_evictions
        );
        let mbps = |d: Duration| m.state_bytes as f64 / d.as_secs_f64() / 1e9;
        let (ci, co) = (pct(&mut copy_in, 0.5), pct(&mut copy_out, 0.5));
        println!(
            "  save p50: AllocateState {:?} + copy in {:?} ({:.1} GB/s) + CommitState/Release {:?}",
            pct(&mut alloc, 0.5),
            ci,
            mbps(ci),
            pct(&mut commit, 0.5)
        );
        println!("  restore p50: Lookup {:?} + copy out {:?} ({:.1} GB/s)", pct(&mut lookup, 0.5), co, mbps(co));
        drop(s);
        drop(client);
        let _ = stop.send(());
        let _ = server.await;
    }
}
