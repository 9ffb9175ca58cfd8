//! KV-cache events in the format vLLM publishes them, so llm-d's precise prefix scorer (and
//! any other consumer of vLLM's stream) can index which prefixes this arena holds.
//!
//! The page table records an event for every full page it publishes (`BlockStored`: the
//! page's chained hash, its parent's, its tokens) and every full page it evicts
//! (`BlockRemoved`), and `AllBlocksCleared` when the arena is emptied (a new page layout) and
//! once at start. Partial pages are not reported: a consumer's blocks all have `block_size`
//! tokens. Recurrent-state snapshots (hybrid models) have no place in this format either;
//! `edge_cache_states_cached` and the engine's restore counters are where they show.
//!
//! Wire format (vLLM's `ZmqEventPublisher`, msgspec `array_like` structs): each batch is a
//! ZeroMQ multipart message `[topic, sequence (u64, big-endian), payload]`, the payload a
//! MessagePack array `[ts, [event, ...], data_parallel_rank]` and each event an array led by
//! its tag: `["BlockStored", [hash], parent_hash | nil, [token, ...], block_size, lora_id,
//! medium]`, `["BlockRemoved", [hash], medium]`, `["AllBlocksCleared"]`.
//!
//! The stream's epoch is the cache-service process: its sequence numbers start at 0 and its
//! first batch clears everything, so a subscriber that sees the sequence go back (a restarted
//! cache-service, whose arena is new) drops what it had. Engines restarting against a live
//! cache-service change nothing here: the pages they published stay in the arena, and stay
//! valid for the engine that replaces them (same model fingerprint).

use std::time::{SystemTime, UNIX_EPOCH};

/// One change of the arena's set of full pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// A full page was published: its chained hash, the hash of the page before it (None for
    /// a first page) and its tokens.
    Stored { hash: u64, parent: Option<u64>, tokens: Vec<u32> },
    /// A full page was evicted.
    Removed { hash: u64 },
    /// Every page is gone.
    AllCleared,
}

/// The `medium` field: where the blocks live. The arena is host (on Thor: unified) memory.
const MEDIUM: &str = "CPU";

/// One batch as its MessagePack payload. A block's `block_size` is its token count (every
/// reported page is full, so it is the arena's page size).
pub fn encode_batch(events: &[KvEvent]) -> Vec<u8> {
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    encode_batch_at(events, ts)
}

fn encode_batch_at(events: &[KvEvent], ts: f64) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_f64, write_nil, write_str, write_u32, write_u64};
    // Writing into a Vec cannot fail, so the results are ignored.
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    let w = &mut out;
    let _ = write_array_len(w, 3);
    let _ = write_f64(w, ts);
    let _ = write_array_len(w, events.len() as u32);
    for event in events {
        match event {
            KvEvent::Stored { hash, parent, tokens } => {
                let _ = write_array_len(w, 7);
                let _ = write_str(w, "BlockStored");
                let _ = write_array_len(w, 1);
                let _ = write_u64(w, *hash);
                match parent {
                    Some(p) => {
                        let _ = write_u64(w, *p);
                    }
                    None => {
                        let _ = write_nil(w);
                    }
                }
                let _ = write_array_len(w, tokens.len() as u32);
                for &t in tokens {
                    let _ = write_u32(w, t);
                }
                let _ = write_u64(w, tokens.len() as u64);
                let _ = write_nil(w); // lora_id: no LoRA
                let _ = write_str(w, MEDIUM);
            }
            KvEvent::Removed { hash } => {
                let _ = write_array_len(w, 3);
                let _ = write_str(w, "BlockRemoved");
                let _ = write_array_len(w, 1);
                let _ = write_u64(w, *hash);
                let _ = write_str(w, MEDIUM);
            }
            KvEvent::AllCleared => {
                let _ = write_array_len(w, 1);
                let _ = write_str(w, "AllBlocksCleared");
            }
        }
    }
    let _ = write_nil(w); // data_parallel_rank
    out
}

/// Publishes batches on a ZeroMQ PUB socket until the sending side is dropped.
#[derive(Debug)]
pub struct Publisher {
    batches: tokio::sync::mpsc::UnboundedSender<Vec<KvEvent>>,
}

impl Publisher {
    /// Binds `endpoint` (e.g. `tcp://0.0.0.0:5557`) and publishes every batch sent through the
    /// returned handle under `topic`, numbered from 0; the first batch clears everything.
    pub async fn bind(endpoint: &str, topic: String) -> Result<Publisher, zeromq::ZmqError> {
        use zeromq::{Socket, SocketSend};
        let mut socket = zeromq::PubSocket::new();
        socket.bind(endpoint).await?;
        let (batches, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<KvEvent>>();
        let _ = batches.send(vec![KvEvent::AllCleared]);
        tokio::spawn(async move {
            let mut sequence: u64 = 0;
            while let Some(batch) = rx.recv().await {
                let mut message = zeromq::ZmqMessage::from(topic.clone().into_bytes());
                message.push_back(sequence.to_be_bytes().to_vec().into());
                message.push_back(encode_batch(&batch).into());
                if let Err(e) = socket.send(message).await {
                    tracing::warn!(error = %e, "cannot publish a KV event batch");
                }
                sequence += 1;
            }
        });
        Ok(Publisher { batches })
    }

    /// Queues a batch (never blocks the page table's lock holder).
    pub fn publish(&self, events: Vec<KvEvent>) {
        if !events.is_empty() {
            let _ = self.batches.send(events);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    #[test]
    fn a_batch_is_vllms_array_like_event_batch() {
        let events = vec![
            KvEvent::Stored { hash: 7, parent: None, tokens: vec![1, 2] },
            KvEvent::Stored { hash: u64::MAX, parent: Some(7), tokens: vec![3, 4] },
            KvEvent::Removed { hash: 7 },
            KvEvent::AllCleared,
        ];
        let bytes = encode_batch_at(&events, 1.5);
        let v = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let batch = v.as_array().unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0], Value::F64(1.5));
        assert_eq!(batch[2], Value::Nil);
        let ev = batch[1].as_array().unwrap();
        let stored = ev[0].as_array().unwrap();
        assert_eq!(stored[0].as_str(), Some("BlockStored"));
        assert_eq!(stored[1], Value::Array(vec![Value::from(7u64)]));
        assert_eq!(stored[2], Value::Nil);
        assert_eq!(stored[3], Value::Array(vec![Value::from(1u32), Value::from(2u32)]));
        assert_eq!(stored[4], Value::from(2u64));
        assert_eq!(stored[5], Value::Nil);
        assert_eq!(stored[6].as_str(), Some("CPU"));
        let child = ev[1].as_array().unwrap();
        assert_eq!(child[1], Value::Array(vec![Value::from(u64::MAX)]));
        assert_eq!(child[2], Value::from(7u64));
        let removed = ev[2].as_array().unwrap();
        assert_eq!((removed[0].as_str(), removed.len()), (Some("BlockRemoved"), 3));
        assert_eq!(ev[3], Value::Array(vec![Value::from("AllBlocksCleared")]));
    }
}
