//! Metric names (constants) and their descriptions. Counters count tokens or events; hit
//! tokens carry a bounded `kind` label (`full_page`, `partial_page`); missed tokens a `reason`
//! label (`no_match`, `evicted`, `salt_mismatch`, `no_state_snapshot`, `last_token`).

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::table::{Counters, TableStats};

pub const PROMPT_TOKENS_QUERIED: &str = "edge_cache_prompt_tokens_queried_total";
pub const TOKENS_HIT: &str = "edge_cache_tokens_hit_total";
pub const LOOKUPS: &str = "edge_cache_lookups_total";
pub const COMMITS: &str = "edge_cache_commits_total";
pub const PAGES_COMMITTED: &str = "edge_cache_pages_committed_total";
pub const EVICTIONS: &str = "edge_cache_evictions_total";
pub const PAGES_USED: &str = "edge_cache_pages_used";
pub const PAGES_FREE: &str = "edge_cache_pages_free";
pub const PAGES_PINNED: &str = "edge_cache_pages_pinned";
pub const PAGES_CACHED: &str = "edge_cache_pages_cached";
pub const SESSIONS: &str = "edge_cache_sessions";
pub const TOKENS_MISSED: &str = "edge_cache_tokens_missed_total";
pub const PARTIAL_PAGES_COMMITTED: &str = "edge_cache_partial_pages_committed_total";
pub const PAGES_PARTIAL: &str = "edge_cache_pages_partial";
pub const LOOKUP_SECONDS: &str = "edge_cache_lookup_seconds";
pub const COMMIT_SECONDS: &str = "edge_cache_commit_seconds";
pub const STATE_SNAPSHOTS_STORED: &str = "edge_cache_state_snapshots_stored_total";
pub const STATE_RESTORES: &str = "edge_cache_state_restores_total";
pub const STATE_LOOKUPS: &str = "edge_cache_state_lookups_total";
pub const STATE_EVICTIONS: &str = "edge_cache_state_evictions_total";
pub const STATES_CACHED: &str = "edge_cache_states_cached";
pub const STATE_PAGES: &str = "edge_cache_state_pages";
pub const STATE_BYTES: &str = "edge_cache_state_bytes";

/// Label values of [`TOKENS_HIT`]: whole pages, and a page used in part.
pub const KIND_FULL_PAGE: &str = "full_page";
pub const KIND_PARTIAL_PAGE: &str = "partial_page";

/// Histogram buckets for the latency histograms (seconds): 1 µs .. 100 ms.
pub const LATENCY_BUCKETS_SECONDS: &[f64] =
    &[1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 1e-1];

static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> = std::sync::OnceLock::new();

/// The Prometheus exporter on `addr` (latency histograms with [`LATENCY_BUCKETS_SECONDS`]).
/// Call inside a Tokio runtime.
pub fn install_exporter(addr: std::net::SocketAddr) -> Result<(), metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS_SECONDS)?
        .build()?;
    let _ = HANDLE.set(recorder.handle());
    metrics::set_global_recorder(recorder)?;
    tokio::spawn(exporter);
    Ok(())
}

/// The exporter's page as `/metrics` serves it (empty when no exporter was installed).
pub fn render() -> String {
    HANDLE.get().map(|h| h.render()).unwrap_or_default()
}

/// Registers descriptions with the installed recorder (call once at startup).
pub fn describe() {
    describe_counter!(PROMPT_TOKENS_QUERIED, Unit::Count, "Prompt tokens sent to Lookup");
    describe_counter!(TOKENS_HIT, Unit::Count, "Prompt tokens served from the cache, by kind");
    describe_counter!(TOKENS_MISSED, Unit::Count, "Prompt tokens not served from the cache, by reason");
    describe_counter!(PARTIAL_PAGES_COMMITTED, Unit::Count, "Partial pages (prefix tails) published by Commit");
    describe_gauge!(PAGES_PARTIAL, Unit::Count, "Cached partial pages");
    describe_counter!(LOOKUPS, Unit::Count, "Lookup calls");
    describe_counter!(COMMITS, Unit::Count, "Commit calls");
    describe_counter!(PAGES_COMMITTED, Unit::Count, "Pages newly published by Commit");
    describe_counter!(EVICTIONS, Unit::Count, "Cached pages evicted to make room");
    describe_gauge!(PAGES_USED, Unit::Count, "Arena pages not free (cached or leased)");
    describe_gauge!(PAGES_FREE, Unit::Count, "Arena pages free");
    describe_gauge!(PAGES_PINNED, Unit::Count, "Arena pages referenced by a session");
    describe_gauge!(PAGES_CACHED, Unit::Count, "Arena pages committed (reusable by hash)");
    describe_gauge!(SESSIONS, Unit::Count, "Attached engine sessions");
    describe_counter!(STATE_SNAPSHOTS_STORED, Unit::Count, "Recurrent-state snapshots published");
    describe_counter!(STATE_RESTORES, Unit::Count, "Lookups that served a recurrent-state snapshot");
    describe_counter!(STATE_LOOKUPS, Unit::Count, "Lookups that asked for a recurrent-state snapshot");
    describe_counter!(
        STATE_EVICTIONS,
        Unit::Count,
        "Cached state snapshots evicted (for room, or with their prefix's pages)"
    );
    describe_gauge!(STATES_CACHED, Unit::Count, "Published state snapshots");
    describe_gauge!(STATE_PAGES, Unit::Count, "Arena pages holding state snapshot bytes");
    describe_gauge!(STATE_BYTES, Unit::Bytes, "State snapshot bytes in the arena");
    describe_histogram!(LOOKUP_SECONDS, Unit::Seconds, "Lookup latency inside the cache-service");
    describe_histogram!(COMMIT_SECONDS, Unit::Seconds, "Commit latency inside the cache-service");
}

/// Publishes counter increments (`after - before`) and the current gauges.
pub fn record(before: &Counters, after: &TableStats) {
    let c = &after.counters;
    counter!(PROMPT_TOKENS_QUERIED).increment(c.prompt_tokens_queried - before.prompt_tokens_queried);
    counter!(TOKENS_HIT, "kind" => KIND_FULL_PAGE).increment(c.tokens_hit_full_pages - before.tokens_hit_full_pages);
    counter!(TOKENS_HIT, "kind" => KIND_PARTIAL_PAGE)
        .increment(c.tokens_hit_partial_pages - before.tokens_hit_partial_pages);
    for (reason, now, was) in [
        ("no_match", c.tokens_missed_no_match, before.tokens_missed_no_match),
        ("evicted", c.tokens_missed_evicted, before.tokens_missed_evicted),
        ("salt_mismatch", c.tokens_missed_salt_mismatch, before.tokens_missed_salt_mismatch),
        ("no_state_snapshot", c.tokens_missed_no_state, before.tokens_missed_no_state),
        ("last_token", c.tokens_missed_last_token, before.tokens_missed_last_token),
    ] {
        counter!(TOKENS_MISSED, "reason" => reason).increment(now - was);
    }
    counter!(PARTIAL_PAGES_COMMITTED).increment(c.partial_pages_committed - before.partial_pages_committed);
    gauge!(PAGES_PARTIAL).set(f64::from(after.pages_partial));
    counter!(LOOKUPS).increment(c.lookups - before.lookups);
    counter!(COMMITS).increment(c.commits - before.commits);
    counter!(PAGES_COMMITTED).increment(c.pages_committed - before.pages_committed);
    counter!(EVICTIONS).increment(c.evictions - before.evictions);
    gauge!(PAGES_USED).set(f64::from(after.pages_total - after.pages_free));
    gauge!(PAGES_FREE).set(f64::from(after.pages_free));
    gauge!(PAGES_PINNED).set(f64::from(after.pages_pinned));
    gauge!(PAGES_CACHED).set(f64::from(after.pages_cached));
    gauge!(SESSIONS).set(f64::from(after.sessions));
    counter!(STATE_SNAPSHOTS_STORED).increment(c.states_committed - before.states_committed);
    counter!(STATE_RESTORES).increment(c.state_restores - before.state_restores);
    counter!(STATE_LOOKUPS).increment(c.state_lookups - before.state_lookups);
    counter!(STATE_EVICTIONS).increment(c.state_evictions - before.state_evictions);
    gauge!(STATES_CACHED).set(f64::from(after.states_cached));
    gauge!(STATE_PAGES).set(f64::from(after.state_pages));
    gauge!(STATE_BYTES).set(after.state_bytes as f64);
}

pub fn record_lookup_latency(d: Duration) {
    histogram!(LOOKUP_SECONDS).record(d.as_secs_f64());
}

pub fn record_commit_latency(d: Duration) {
    histogram!(COMMIT_SECONDS).record(d.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn recorded_deltas_appear_under_the_documented_names() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let mut after = TableStats {
            pages_total: 10,
            pages_free: 7,
            pages_cached: 2,
            pages_pinned: 1,
            sessions: 1,
            ..Default::default()
        };
        after.counters.prompt_tokens_queried = 100;
        after.counters.tokens_hit_full_pages = 64;
        after.counters.tokens_hit_partial_pages = 5;
        after.counters.tokens_missed_evicted = 30;
        after.counters.tokens_missed_last_token = 1;
        after.counters.lookups = 1;
        after.counters.tokens_missed_no_state = 12;
        after.counters.states_committed = 2;
        after.counters.state_restores = 1;
        after.state_bytes = 4096;
        metrics::with_local_recorder(&recorder, || {
            describe();
            record(&Counters::default(), &after);
            record_lookup_latency(Duration::from_micros(20));
        });
        let text = handle.render();
        for line in [
            "edge_cache_prompt_tokens_queried_total 100",
            "edge_cache_tokens_hit_total{kind=\"full_page\"} 64",
            "edge_cache_tokens_hit_total{kind=\"partial_page\"} 5",
            "edge_cache_tokens_missed_total{reason=\"evicted\"} 30",
            "edge_cache_tokens_missed_total{reason=\"last_token\"} 1",
            "edge_cache_lookups_total 1",
            "edge_cache_pages_used 3",
            "edge_cache_pages_free 7",
            "edge_cache_pages_cached 2",
            "edge_cache_pages_pinned 1",
            "edge_cache_sessions 1",
            "edge_cache_tokens_missed_total{reason=\"no_state_snapshot\"} 12",
            "edge_cache_state_snapshots_stored_total 2",
            "edge_cache_state_restores_total 1",
            "edge_cache_state_bytes 4096",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(text.contains("edge_cache_lookup_seconds"));
    }
}
