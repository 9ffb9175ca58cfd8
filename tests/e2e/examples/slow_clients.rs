//! What slow and flooding clients cost a normal one, against the real stack (started here by
//! `e2e::Stack`). A normal client sends short chat completions, each on a fresh connection
//! (the hard case: an open pooled connection is never shed); its latency is measured alone,
//! then while attackers hold connections:
//! - `silent`: connections that send half a request head and then nothing, opened in waves
//!   well past the gateway's connection limit (slowloris);
//! - `slow body`: requests whose headers promise a body that never comes.
//!
//! Run: `cargo build --release --bins && cargo run --release -p e2e --example slow_clients -- --attackers 2000`.

use std::time::{Duration, Instant};

use e2e::{Stack, StackOptions, http_get, metric};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const MAX_CONNECTIONS: usize = 256;
const SAMPLES: usize = 20;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Latencies (ms) of `SAMPLES` chats in a row, each on its own connection, and the failures.
async fn normal_client(stack: &Stack) -> (Vec<f64>, usize) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let body = e2e::explain_request("slow clients", 4);
    let (mut ms, mut failed) = (Vec::new(), 0);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        let sent = client.post(format!("{}/v1/chat/completions", stack.base_url)).json(&body).send().await;
        let ok = match sent {
            Ok(r) => r.status() == 200 && r.text().await.is_ok(),
            Err(_) => false,
        };
        if ok {
            ms.push(started.elapsed().as_secs_f64() * 1e3);
        } else {
            failed += 1;
        }
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    (ms, failed)
}

async fn attack(addr: String, n: usize, slow_body: bool) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(mut s) = TcpStream::connect(&addr).await else { continue };
        let head: &[u8] = if slow_body {
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"model\":"
        } else {
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-pad: "
        };
        if s.write_all(head).await.is_ok() {
            held.push(s);
        }
    }
    held
}

fn report(label: &str, (ms, failed): &(Vec<f64>, usize)) {
    if ms.is_empty() {
        println!("| {label} | - | - | {failed}/{SAMPLES} |");
    } else {
        println!("| {label} | {:.1} | {:.1} | {failed}/{SAMPLES} |", percentile(ms, 0.5), percentile(ms, 0.99));
    }
}

#[tokio::main]
async fn main() {
    let mut attackers = 2000usize;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--attackers", Some(n)) => attackers = n,
            _ => {
                eprintln!("usage: slow_clients [--attackers N]");
                std::process::exit(2);
            }
        }
    }
    let stack = Stack::start_with(StackOptions {
        gateway_args: vec!["--max-connections".into(), MAX_CONNECTIONS.to_string()],
        ..Default::default()
    });
    let addr = stack.base_url.trim_start_matches("http://").to_owned();
    let gateway_metrics = format!("{}/metrics", stack.base_url);
    println!(
        "gateway --max-connections {MAX_CONNECTIONS}; {attackers} attacker connections; {SAMPLES} chats of 4 tokens, each on a fresh connection\n"
    );
    println!("| normal client | p50 ms | p99 ms | failed |");
    println!("|---|---|---|---|");
    report("alone", &normal_client(&stack).await);

    let silent = attack(addr.clone(), attackers, false).await;
    report(&format!("with {} silent connections held", silent.len()), &normal_client(&stack).await);
    // New waves keep arriving while the client works.
    let waves = tokio::spawn({
        let addr = addr.clone();
        async move {
            let mut all = Vec::new();
            for _ in 0..20 {
                all.extend(attack(addr.clone(), MAX_CONNECTIONS / 2, false).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            all
        }
    });
    report("with waves of silent connections arriving", &normal_client(&stack).await);
    drop(waves.await);
    drop(silent);

    let slow = attack(addr.clone(), attackers, true).await;
    report(&format!("with {} slow-body requests held", slow.len()), &normal_client(&stack).await);
    drop(slow);

    let page = http_get(&gateway_metrics).unwrap_or_default();
    println!(
        "\nshed: evicted {} refused {}",
        metric(&page, "edge_gateway_connections_shed_total{how=\"evicted\"}"),
        metric(&page, "edge_gateway_connections_shed_total{how=\"refused\"}")
    );
}
