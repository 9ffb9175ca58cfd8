//! The cache-service's KV event stream (vLLM's ZeroMQ format, for llm-d's precise prefix
//! scorer) against its own page table, through the real stack: a subscriber decodes every
//! batch while prompts of known token ids are served, in an arena small enough to evict.
//!
//! - each prompt's full pages arrive as `BlockStored` with exactly its tokens, 16 per block,
//!   chained: the first block has no parent, each next one names the previous block's hash;
//! - every `BlockRemoved` names a block stored before and not removed since;
//! - the blocks stored and not removed are as many as the full pages the cache-service's own
//!   table holds (`edge_cache_pages_cached` less `edge_cache_pages_partial`);
//! - the sequence numbers count up by one, and the topic is the configured one.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use e2e::{Stack, StackOptions};
use rmpv::Value;
use serde_json::json;
use zeromq::{Socket, SocketRecv};

const PAGE_TOKENS: usize = 16;
const TOPIC: &str = "kv@e2e@edge";

#[derive(Debug)]
enum Event {
    Stored { hash: u64, parent: Option<u64>, tokens: Vec<u32>, block_size: u64 },
    Removed { hash: u64 },
    AllCleared,
}

fn decode(payload: &[u8]) -> Vec<Event> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("a MessagePack payload");
    let batch = batch.as_array().expect("[ts, events, data_parallel_rank]");
    assert_eq!(batch.len(), 3, "{batch:?}");
    assert!(batch[0].as_f64().is_some_and(|ts| ts > 1.7e9), "a Unix timestamp: {:?}", batch[0]);
    let u64s = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect::<Vec<u64>>();
    batch[1]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let e = e.as_array().unwrap();
            match e[0].as_str().unwrap() {
                "BlockStored" => {
                    let hashes = u64s(&e[1]);
                    assert_eq!(hashes.len(), 1);
                    Event::Stored {
                        hash: hashes[0],
                        parent: e[2].as_u64(),
                        tokens: u64s(&e[3]).into_iter().map(|t| t as u32).collect(),
                        block_size: e[4].as_u64().unwrap(),
                    }
                }
                "BlockRemoved" => Event::Removed { hash: u64s(&e[1])[0] },
                "AllBlocksCleared" => Event::AllCleared,
                other => panic!("unknown event {other}"),
            }
        })
        .collect()
}

/// Every batch that arrives until none has for `quiet`.
async fn drain(sub: &mut zeromq::SubSocket, quiet: Duration, sequence: &mut Option<u64>) -> Vec<Event> {
    let mut events = Vec::new();
    while let Ok(message) = tokio::time::timeout(quiet, sub.recv()).await {
        let message = message.expect("a ZeroMQ message");
        let frames: Vec<_> = message.into_vec();
        assert_eq!(frames.len(), 3, "[topic, sequence, payload]");
        assert_eq!(&frames[0][..], TOPIC.as_bytes());
        let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8 bytes"));
        if let Some(last) = *sequence {
            assert_eq!(seq, last + 1, "sequence numbers count up by one");
        }
        *sequence = Some(seq);
        events.extend(decode(&frames[2]));
    }
    events
}

fn prompt(n: u32) -> Vec<u32> {
    // Five full pages of ids of this prompt's own (well inside the vocabulary).
    (0..5 * PAGE_TOKENS as u32).map(|i| 1000 + n * 100 + i).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kv_events_follow_the_page_table() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    // 8 MiB: about 22 pages of the default model, so a few prompts evict the first ones.
    let stack = Stack::start_with(StackOptions {
        cache_args: vec![
            "--kv-events-endpoint".into(),
            endpoint.clone(),
            "--kv-events-topic".into(),
            TOPIC.into(),
            "--arena-bytes".into(),
            (8u64 << 20).to_string(),
        ],
        ..Default::default()
    });
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&endpoint).await.expect("connect to the event stream");
    sub.subscribe("").await.unwrap();
    let mut sequence = None;
    // The subscription reaches the publisher asynchronously; what was published before it
    // (the start's AllBlocksCleared, the engine's attach) is not replayed.
    let _ = drain(&mut sub, Duration::from_millis(500), &mut sequence).await;

    let mut live: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut removed_ever: HashSet<u64> = HashSet::new();
    for n in 0..8 {
        let ids = prompt(n);
        let reply = e2e::client()
            .post(format!("{}/v1/completions", stack.base_url))
            .json(&json!({"prompt": ids, "max_tokens": 1, "temperature": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 200, "{}", reply.text().await.unwrap());
        let events = drain(&mut sub, Duration::from_millis(400), &mut sequence).await;
        let mut stored_now = Vec::new();
        for event in events {
            match event {
                Event::Stored { hash, parent, tokens, block_size } => {
                    assert_eq!(block_size, PAGE_TOKENS as u64);
                    assert_eq!(tokens.len(), PAGE_TOKENS);
                    if let Some(p) = parent {
                        assert!(live.contains_key(&p), "the parent of a stored block is a live block");
                    }
                    assert!(live.insert(hash, tokens.clone()).is_none(), "a block stored twice without removal");
                    stored_now.push((hash, parent, tokens));
                }
                Event::Removed { hash } => {
                    assert!(live.remove(&hash).is_some(), "a removed block was stored and live");
                    removed_ever.insert(hash);
                }
                Event::AllCleared => live.clear(),
            }
        }
        // This prompt's five pages, in order, chained.
        assert_eq!(stored_now.len(), 5, "prompt {n}: {stored_now:?}");
        for (k, (hash, parent, tokens)) in stored_now.iter().enumerate() {
            assert_eq!(tokens[..], ids[k * PAGE_TOKENS..(k + 1) * PAGE_TOKENS], "prompt {n} block {k}");
            let expected_parent = if k == 0 { None } else { Some(stored_now[k - 1].0) };
            assert_eq!(*parent, expected_parent, "prompt {n} block {k} ({hash})");
        }
        // The stream and the table agree on the full pages held.
        let page = e2e::http_get(&stack.cache_metrics_url).unwrap();
        let table_full = e2e::metric(&page, "edge_cache_pages_cached") - e2e::metric(&page, "edge_cache_pages_partial");
        assert_eq!(live.len() as f64, table_full, "after prompt {n}: blocks live in the stream vs the table");
    }
    assert!(!removed_ever.is_empty(), "the small arena evicted blocks, and the stream said so");
}
