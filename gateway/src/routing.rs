//! Several engines behind one gateway: which engine serves a request.
//!
//! Agents resend their whole conversation every turn, so the engine that served the last turn
//! holds its prefix (KV pages, recurrent state); a turn sent elsewhere re-prefills it. The
//! affine policy therefore sends
//!
//! 1. a conversation with an `X-Session-ID` to the engine that served it before;
//! 2. otherwise the engine with the best score: 3 x the share of this prompt's leading blocks
//!    it was sent before (blocks of [`BLOCK_TOKENS`] tokens, hashed in a chain under the
//!    request's cache salt, as the cache-service keys pages) + 1 x how short its queue is
//!    (1 for the least loaded engine, 0 for the most), the weights of llm-d's prefix and
//!    queue scorers. A turn of a conversation stays where its history is; a new one that
//!    shares little with what an engine holds goes to the less loaded engine.
//!
//! Neither picks an engine with [`MAX_AFFINE_IMBALANCE`] requests more in flight than the
//! least loaded one: a moved conversation re-prefills, which costs less than a backlog that
//! long, and it is how an engine that has not yet seen a common system prompt gets some.
//!
//! The round-robin policy ignores all of it (the baseline the load test compares against).
//!
//! An engine is taken out when its health probe fails (every [`HEALTH_INTERVAL`]) or a call
//! to it cannot be placed; its conversations move on their next turn. An engine that comes
//! (back) up is put in only after its `Info` shows the model the gateway serves.
//! What the gateway sent where is its own record: an engine may have evicted a prefix since,
//! which costs that turn a prefill, never a wrong answer.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::engine_client::{EngineClient, EngineHealth};

/// Tokens per routing block (the cache-service's default page size).
pub const BLOCK_TOKENS: usize = 16;
/// How often each engine's health is probed.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// In-flight requests an engine may have beyond the least loaded one and still be chosen
/// for affinity.
pub const MAX_AFFINE_IMBALANCE: usize = 8;
/// Weights of the two scores (llm-d's default profile weighs its prefix and queue scorers
/// the same way): the share of the prompt's blocks an engine was sent, and how short its
/// queue is between the longest (0) and the shortest (1).
const PREFIX_WEIGHT: usize = 3;
const QUEUE_WEIGHT: usize = 1;
/// Blocks remembered per engine (about 4M tokens of prompts), oldest dropped first.
const MAX_BLOCKS_PER_ENGINE: usize = 1 << 18;
/// An engine found serving another model is checked again every this many probes.
const OTHER_MODEL_RECHECK_PROBES: u32 = 30;
/// Sessions remembered, oldest dropped first.
const MAX_SESSIONS: usize = 1 << 16;

/// How requests are spread over the engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RoutePolicy {
    /// Session, then longest prefix, then least loaded.
    #[default]
    Affine,
    /// Each request to the next engine in turn.
    RoundRobin,
}

impl RoutePolicy {
    pub fn name(self) -> &'static str {
        match self {
            RoutePolicy::Affine => "affine",
            RoutePolicy::RoundRobin => "round-robin",
        }
    }
}

/// Why an engine was chosen (the `edge_gateway_routed_total` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteReason {
    Session,
    Prefix,
    LeastLoaded,
    RoundRobin,
}

impl RouteReason {
    pub fn name(self) -> &'static str {
        match self {
            RouteReason::Session => "session",
            RouteReason::Prefix => "prefix",
            RouteReason::LeastLoaded => "least_loaded",
            RouteReason::RoundRobin => "round_robin",
        }
    }
}

/// What routing knows of a request.
#[derive(Debug, Clone, Default)]
pub struct RouteKey {
    /// `X-Session-ID` (empty: none).
    pub session: String,
    /// Chained hashes of the prompt's whole blocks.
    pub blocks: Vec<u64>,
}

impl RouteKey {
    pub fn new(session: &str, cache_salt: &str, prompt_ids: &[u32]) -> RouteKey {
        let mut blocks = Vec::with_capacity(prompt_ids.len() / BLOCK_TOKENS);
        let mut parent = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            cache_salt.hash(&mut h);
            h.finish()
        };
        for block in prompt_ids.chunks_exact(BLOCK_TOKENS) {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            parent.hash(&mut h);
            block.hash(&mut h);
            parent = h.finish();
            blocks.push(parent);
        }
        RouteKey { session: session.to_owned(), blocks }
    }
}

const STATE_UNVERIFIED: u8 = 0;
const STATE_UP: u8 = 1;
const STATE_DOWN: u8 = 2;
/// Serves another model than the gateway's: never routed to until it changes.
const STATE_OTHER_MODEL: u8 = 3;

/// One engine and what routing tracks of it.
#[derive(Debug)]
pub struct EngineSlot {
    pub endpoint: String,
    pub client: EngineClient,
    state: AtomicU8,
    in_flight: AtomicUsize,
    /// Health probes so far.
    probes: std::sync::atomic::AtomicU32,
    /// Prompt blocks sent to this engine, with the tick they were last sent at.
    blocks: Mutex<HashMap<u64, u64>>,
}

impl EngineSlot {
    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_UP
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// "up", "down", "unverified" or "other_model", for `/health` and the status page.
    pub fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Acquire) {
            STATE_UP => "up",
            STATE_DOWN => "down",
            STATE_OTHER_MODEL => "other_model",
            _ => "unverified",
        }
    }

    /// Leading blocks of `key` this engine was sent.
    fn matched_blocks(&self, key: &RouteKey) -> usize {
        let blocks = self.blocks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        key.blocks.iter().take_while(|b| blocks.contains_key(b)).count()
    }

    fn remember(&self, key: &RouteKey, tick: u64) {
        let mut blocks = self.blocks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for b in &key.blocks {
            blocks.insert(*b, tick);
        }
        if blocks.len() > MAX_BLOCKS_PER_ENGINE {
            keep_newer_half(&mut blocks, |t| *t);
        }
    }
}

/// Drops the older half of `map` by the tick `tick_of` reads from each value: a rare
/// O(n log n), amortized over the half of the capacity it frees.
fn keep_newer_half<K, V>(map: &mut HashMap<K, V>, tick_of: impl Fn(&V) -> u64) {
    let mut ticks: Vec<u64> = map.values().map(&tick_of).collect();
    ticks.sort_unstable();
    let cutoff = ticks[ticks.len() / 2];
    map.retain(|_, v| tick_of(v) > cutoff);
}

/// A request's hold on an engine: counted in its load until dropped.
#[derive(Debug)]
pub struct Lease {
    slot: Arc<EngineSlot>,
    pub index: usize,
    pub reason: RouteReason,
}

impl Lease {
    pub fn client(&self) -> &EngineClient {
        &self.slot.client
    }

    pub fn endpoint(&self) -> &str {
        &self.slot.endpoint
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The engines behind the gateway. Cheap to share (`Arc` inside).
#[derive(Debug, Clone)]
pub struct EnginePool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    engines: Vec<Arc<EngineSlot>>,
    policy: RoutePolicy,
    next: AtomicUsize,
    tick: std::sync::atomic::AtomicU64,
    /// Session id -> (engine index, tick of its last placement).
    sessions: Mutex<HashMap<String, (usize, u64)>>,
}

impl From<EngineClient> for EnginePool {
    /// One engine, taken as up (what tests and single-engine setups start from).
    fn from(client: EngineClient) -> EnginePool {
        let pool = EnginePool::new(vec![("engine".to_owned(), client)], RoutePolicy::Affine);
        pool.inner.engines[0].state.store(STATE_UP, Ordering::Release);
        pool
    }
}

impl EnginePool {
    /// Engines start unverified: the health task checks their model before routing to them.
    pub fn new(engines: Vec<(String, EngineClient)>, policy: RoutePolicy) -> EnginePool {
        assert!(!engines.is_empty(), "an engine pool needs an engine");
        let engines = engines
            .into_iter()
            .map(|(endpoint, client)| {
                Arc::new(EngineSlot {
                    endpoint,
                    client,
                    state: AtomicU8::new(STATE_UNVERIFIED),
                    in_flight: AtomicUsize::new(0),
                    probes: std::sync::atomic::AtomicU32::new(0),
                    blocks: Mutex::new(HashMap::new()),
                })
            })
            .collect();
        EnginePool {
            inner: Arc::new(PoolInner {
                engines,
                policy,
                next: AtomicUsize::new(0),
                tick: std::sync::atomic::AtomicU64::new(0),
                sessions: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn engines(&self) -> &[Arc<EngineSlot>] {
        &self.inner.engines
    }

    pub fn policy(&self) -> RoutePolicy {
        self.inner.policy
    }

    /// The first engine that is up, else the first one (the status page's engine).
    pub fn primary(&self) -> &EngineClient {
        let engines = &self.inner.engines;
        &engines.iter().find(|e| e.is_up()).unwrap_or(&engines[0]).client
    }

    /// Marks an engine up (its model checked) or down.
    pub fn set_up(&self, index: usize, up: bool) {
        let state = if up { STATE_UP } else { STATE_DOWN };
        let previous = self.inner.engines[index].state.swap(state, Ordering::AcqRel);
        if previous != state {
            let endpoint = &self.inner.engines[index].endpoint;
            if up {
                tracing::info!(%endpoint, "engine up: routing to it");
            } else if previous == STATE_UP {
                tracing::warn!(%endpoint, "engine down: its conversations move to the others");
            }
            crate::metrics::record_engine_up(endpoint, up);
        }
    }

    /// The engine for a request: see the module doc. `tried` are the engines this request
    /// could not be placed on; when every engine is down or tried, the best of all of them
    /// (a restarting engine is then waited for by the caller's retries).
    pub fn choose(&self, key: &RouteKey, tried: &[usize]) -> Lease {
        let engines = &self.inner.engines;
        let open = |i: &usize| !tried.contains(i);
        let mut candidates: Vec<usize> = (0..engines.len()).filter(|i| open(i) && engines[*i].is_up()).collect();
        if candidates.is_empty() {
            candidates = (0..engines.len()).filter(open).collect();
        }
        if candidates.is_empty() {
            candidates = (0..engines.len()).collect();
        }
        let (index, reason) = match self.inner.policy {
            RoutePolicy::RoundRobin => {
                let n = self.inner.next.fetch_add(1, Ordering::Relaxed);
                (candidates[n % candidates.len()], RouteReason::RoundRobin)
            }
            RoutePolicy::Affine => self.affine(key, &candidates),
        };
        let slot = engines[index].clone();
        slot.in_flight.fetch_add(1, Ordering::AcqRel);
        Lease { slot, index, reason }
    }

    fn affine(&self, key: &RouteKey, candidates: &[usize]) -> (usize, RouteReason) {
        let engines = &self.inner.engines;
        // One reading of every load: requests come and go meanwhile, and the scores below
        // must agree with the bounds they are computed against.
        let loads: HashMap<usize, usize> = candidates.iter().map(|&i| (i, engines[i].in_flight())).collect();
        let least = loads.values().copied().min().unwrap_or(0);
        let most = loads.values().copied().max().unwrap_or(0);
        // Past this backlog affinity yields: a moved conversation re-prefills, which costs less.
        let within_bound = |i: usize| loads[&i] <= least + MAX_AFFINE_IMBALANCE;
        if !key.session.is_empty() {
            let sessions = self.inner.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((i, _)) = sessions.get(&key.session)
                && loads.contains_key(i)
                && within_bound(*i)
            {
                return (*i, RouteReason::Session);
            }
        }
        // Never empty: the least loaded candidate is within the bound.
        let open: Vec<usize> = candidates.iter().copied().filter(|&i| within_bound(i)).collect();
        let matched: Vec<usize> = open.iter().map(|&i| engines[i].matched_blocks(key)).collect();
        let total = key.blocks.len().max(1);
        // Integer scores (per mille), so equal engines tie exactly.
        let score = |k: usize| {
            let prefix = PREFIX_WEIGHT * 1000 * matched[k] / total;
            let queue = if most == least { 1000 } else { 1000 * (most - loads[&open[k]]) / (most - least) };
            prefix + QUEUE_WEIGHT * queue
        };
        let by_score = |&a: &usize, &b: &usize| {
            score(a).cmp(&score(b)).then(loads[&open[b]].cmp(&loads[&open[a]])).then(b.cmp(&a))
        };
        let best = (0..open.len()).max_by(by_score).unwrap_or(0);
        let least_matched = matched.iter().copied().min().unwrap_or(0);
        let reason = if matched[best] > least_matched { RouteReason::Prefix } else { RouteReason::LeastLoaded };
        (open[best], reason)
    }

    /// A request was placed on `lease`'s engine: its conversation and prompt are that
    /// engine's from now on.
    pub fn placed(&self, key: &RouteKey, lease: &Lease) {
        let tick = self.inner.tick.fetch_add(1, Ordering::Relaxed);
        if self.inner.policy == RoutePolicy::Affine {
            lease.slot.remember(key, tick);
        }
        if !key.session.is_empty() {
            let mut sessions = self.inner.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            sessions.insert(key.session.clone(), (lease.index, tick));
            if sessions.len() > MAX_SESSIONS {
                keep_newer_half(&mut sessions, |(_, t)| *t);
            }
        }
        crate::metrics::record_routed(&lease.slot.endpoint, lease.reason.name());
    }

    /// A call to `index` could not be placed (no engine listening, connection lost): with
    /// other engines to go to, it is out until its health probe passes again.
    pub fn placement_failed(&self, index: usize) {
        if self.inner.engines.len() > 1 {
            self.set_up(index, false);
        }
    }

    /// Probes every engine every [`HEALTH_INTERVAL`] until the pool is dropped: an engine
    /// that answers is checked to serve `fingerprint` (its `Info`) each time it comes up.
    pub fn spawn_health_checks(&self, fingerprint: String) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(HEALTH_INTERVAL);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let pool = EnginePool { inner };
                let probes = pool.inner.engines.iter().enumerate().map(|(i, slot)| {
                    let pool = pool.clone();
                    let fingerprint = fingerprint.clone();
                    let slot = slot.clone();
                    async move { pool.probe(i, &slot, &fingerprint).await }
                });
                futures::future::join_all(probes).await;
            }
        });
    }

    async fn probe(&self, index: usize, slot: &EngineSlot, fingerprint: &str) {
        let answers = !matches!(slot.client.health(HEALTH_PROBE_TIMEOUT).await, EngineHealth::Down);
        if !answers {
            self.set_up(index, false);
            return;
        }
        let state = slot.state.load(Ordering::Acquire);
        // An engine of another model is asked again only now and then (Info is megabytes).
        let recheck = slot.probes.fetch_add(1, Ordering::Relaxed).is_multiple_of(OTHER_MODEL_RECHECK_PROBES);
        if state == STATE_UP || (state == STATE_OTHER_MODEL && !recheck) {
            return;
        }
        // Up again, or for the first time: the same model as the gateway's, or not used.
        match tokio::time::timeout(HEALTH_PROBE_TIMEOUT * 5, slot.client.info()).await {
            Ok(Ok(info)) if info.model_fingerprint == fingerprint => self.set_up(index, true),
            Ok(Ok(info)) => {
                if slot.state.swap(STATE_OTHER_MODEL, Ordering::AcqRel) != STATE_OTHER_MODEL {
                    tracing::error!(
                        endpoint = %slot.endpoint,
                        model = %info.model_id,
                        fingerprint = %info.model_fingerprint,
                        expected = %fingerprint,
                        "engine serves another model than the gateway's: not routing to it"
                    );
                    crate::metrics::record_engine_up(&slot.endpoint, false);
                }
            }
            _ => self.set_up(index, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize, policy: RoutePolicy) -> EnginePool {
        let engines =
            (0..n).map(|i| (format!("e{i}"), EngineClient::new(&format!("http://127.0.0.1:{}", 1 + i)).unwrap()));
        let pool = EnginePool::new(engines.collect(), policy);
        for i in 0..n {
            pool.inner.engines[i].state.store(STATE_UP, Ordering::Release);
        }
        pool
    }

    fn prompt(conversation: u32, len: usize) -> Vec<u32> {
        // A shared 64-token system prompt, then the conversation's own tokens.
        (0..len).map(|i| if i < 64 { i as u32 } else { conversation * 100_000 + i as u32 }).collect()
    }

    #[tokio::test]
    async fn a_conversation_sticks_to_its_engine_by_prefix_and_new_ones_spread() {
        let pool = pool(2, RoutePolicy::Affine);
        let mut held = Vec::new();
        let mut first_engine = Vec::new();
        for c in 0..4 {
            let key = RouteKey::new("", "", &prompt(c, 200));
            let lease = pool.choose(&key, &[]);
            pool.placed(&key, &lease);
            first_engine.push(lease.index);
            held.push(lease);
        }
        // Four conversations at once, sharing only the system prompt: two per engine.
        assert_eq!(first_engine.iter().filter(|&&e| e == 0).count(), 2, "{first_engine:?}");
        drop(held);
        for c in 0..4 {
            // The next turn: the whole previous prompt and more.
            let key = RouteKey::new("", "", &prompt(c, 300));
            let lease = pool.choose(&key, &[]);
            assert_eq!(lease.index, first_engine[c as usize], "conversation {c}");
            assert_eq!(lease.reason, RouteReason::Prefix);
        }
    }

    #[tokio::test]
    async fn a_session_id_wins_and_a_down_engine_loses_its_conversations() {
        let pool = pool(2, RoutePolicy::Affine);
        let key = RouteKey::new("agent-7", "", &prompt(1, 40));
        let lease = pool.choose(&key, &[]);
        pool.placed(&key, &lease);
        let home = lease.index;
        drop(lease);
        // Another prompt, same session: the session's engine.
        let other = RouteKey::new("agent-7", "", &prompt(2, 500));
        assert_eq!(pool.choose(&other, &[]).index, home);
        pool.set_up(home, false);
        let moved = pool.choose(&other, &[]);
        assert_ne!(moved.index, home);
        pool.placed(&other, &moved);
        drop(moved);
        pool.set_up(home, true);
        assert_ne!(pool.choose(&other, &[]).index, home, "the session stays where it moved");
    }

    #[tokio::test]
    async fn load_beyond_the_imbalance_bound_overrides_a_session() {
        let pool = pool(2, RoutePolicy::Affine);
        let key = RouteKey::new("s", "", &prompt(1, 100));
        let first = pool.choose(&key, &[]);
        pool.placed(&key, &first);
        let home = first.index;
        let mut held = vec![first];
        for _ in 0..MAX_AFFINE_IMBALANCE {
            let lease = pool.choose(&key, &[]);
            assert_eq!(lease.index, home);
            held.push(lease);
        }
        let spill = pool.choose(&key, &[]);
        assert_ne!(spill.index, home, "{} in flight on the home engine", held.len());
        assert_eq!(spill.reason, RouteReason::LeastLoaded);
    }

    #[tokio::test]
    async fn the_salt_separates_prefixes_and_tried_engines_are_skipped() {
        let a = RouteKey::new("", "tenant-a", &prompt(1, 64));
        let b = RouteKey::new("", "tenant-b", &prompt(1, 64));
        assert_eq!(a.blocks.len(), 4);
        assert!(a.blocks.iter().all(|h| !b.blocks.contains(h)));
        let pool = pool(3, RoutePolicy::RoundRobin);
        let picks: Vec<usize> = (0..6).map(|_| pool.choose(&a, &[]).index).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert_eq!(pool.choose(&a, &[0, 1]).index, 2);
        // Every engine tried or down: still an engine, for the caller's retries.
        for i in 0..3 {
            pool.set_up(i, false);
        }
        let _ = pool.choose(&a, &[0, 1, 2]);
    }
}
