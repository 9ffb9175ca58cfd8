//! Gateway metrics: names, descriptions, and the process-wide Prometheus recorder.
//!
//! `install()` is idempotent (the recorder is global; tests build many apps) and returns the
//! handle `/metrics` renders. Labels are bounded: the HTTP status code and the endpoint.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS_TOTAL: &str = "edge_gateway_requests_total";
pub const TTFT_SECONDS: &str = "edge_gateway_ttft_seconds";
pub const INTER_TOKEN_SECONDS: &str = "edge_gateway_inter_token_seconds";
pub const PROMPT_TOKENS_TOTAL: &str = "edge_gateway_prompt_tokens_total";
pub const CACHED_PROMPT_TOKENS_TOTAL: &str = "edge_gateway_cached_prompt_tokens_total";
pub const COMPLETION_TOKENS_TOTAL: &str = "edge_gateway_completion_tokens_total";
pub const QUEUE_DEPTH: &str = "edge_gateway_queue_depth_requests";
pub const IN_FLIGHT: &str = "edge_gateway_in_flight_requests";
pub const E2E_SECONDS: &str = "edge_gateway_e2e_seconds";
pub const ENGINE_DEADLINES_TOTAL: &str = "edge_gateway_engine_deadlines_total";
pub const OPEN_CONNECTIONS: &str = "edge_gateway_open_connections";
pub const CONNECTIONS_SHED_TOTAL: &str = "edge_gateway_connections_shed_total";
pub const ENGINE_UP: &str = "edge_gateway_engine_up";
pub const ENGINE_IN_FLIGHT: &str = "edge_gateway_engine_in_flight_requests";
pub const ROUTED_TOTAL: &str = "edge_gateway_routed_total";

const LATENCY_BUCKETS_SECONDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder once and describes every metric.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(TTFT_SECONDS.to_owned()), LATENCY_BUCKETS_SECONDS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(INTER_TOKEN_SECONDS.to_owned()), LATENCY_BUCKETS_SECONDS)
                })
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(E2E_SECONDS.to_owned()), LATENCY_BUCKETS_SECONDS))
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                // Another recorder was installed first (an embedding program); our handle then
                // renders nothing, which is visible rather than fatal.
                tracing::warn!("a global metrics recorder was already installed");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(REQUESTS_TOTAL, "Completion requests by HTTP status and endpoint");
    describe_histogram!(TTFT_SECONDS, Unit::Seconds, "Time from request arrival to the first generated token");
    describe_histogram!(
        INTER_TOKEN_SECONDS,
        Unit::Seconds,
        "Time between consecutive generated tokens (a chunk's interval split over its tokens)"
    );
    describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens sent to the engine");
    describe_counter!(CACHED_PROMPT_TOKENS_TOTAL, "Prompt tokens the engine served from the prefix cache");
    describe_counter!(COMPLETION_TOKENS_TOTAL, "Tokens generated for clients");
    metrics::describe_gauge!(QUEUE_DEPTH, "Requests waiting for a concurrency slot");
    metrics::describe_gauge!(IN_FLIGHT, "Completion requests holding a concurrency slot");
    describe_histogram!(E2E_SECONDS, Unit::Seconds, "Time from request arrival to the end of generation");
    metrics::describe_gauge!(OPEN_CONNECTIONS, "Open HTTP connections");
    describe_counter!(
        CONNECTIONS_SHED_TOTAL,
        "Connections closed at the connection limit: `evicted` (the oldest without a complete request, to make room) or `refused` (503, every slot busy)"
    );
    describe_counter!(
        ENGINE_DEADLINES_TOTAL,
        "Requests failed by a gateway->engine deadline: `accept` (503, the engine took no call) or `first_token` (504)"
    );
    // Series of rare events are published at zero, so dashboards show a flat line, not "no
    // data", until the first one.
    for deadline in ["accept", "first_token"] {
        metrics::counter!(ENGINE_DEADLINES_TOTAL, "deadline" => deadline).increment(0);
    }
    for how in ["evicted", "refused"] {
        metrics::counter!(CONNECTIONS_SHED_TOTAL, "how" => how).increment(0);
    }
    for counter in [PROMPT_TOKENS_TOTAL, CACHED_PROMPT_TOKENS_TOTAL, COMPLETION_TOKENS_TOTAL] {
        metrics::counter!(counter).increment(0);
    }
    metrics::gauge!(QUEUE_DEPTH).set(0.0);
    metrics::gauge!(IN_FLIGHT).set(0.0);
    metrics::describe_gauge!(ENGINE_UP, "1 while the gateway routes to this engine (it answers and serves the model)");
    metrics::describe_gauge!(ENGINE_IN_FLIGHT, "Requests the gateway has placed on this engine and not finished");
    describe_counter!(
        ROUTED_TOTAL,
        "Requests placed on an engine, by why it was chosen: `session` (X-Session-ID), `prefix` (it was sent more of the prompt), `least_loaded`, `round_robin`"
    );
}

/// Whether the gateway routes to `engine` (an endpoint).
pub fn record_engine_up(engine: &str, up: bool) {
    metrics::gauge!(ENGINE_UP, "engine" => engine.to_owned()).set(if up { 1.0 } else { 0.0 });
}

pub fn record_engine_in_flight(engine: &str, requests: usize) {
    metrics::gauge!(ENGINE_IN_FLIGHT, "engine" => engine.to_owned()).set(requests as f64);
}

/// Counts one request placed on `engine`, with the routing reason.
pub fn record_routed(engine: &str, reason: &'static str) {
    metrics::counter!(ROUTED_TOTAL, "engine" => engine.to_owned(), "reason" => reason).increment(1);
}

/// Counts one finished completion request by HTTP status and endpoint.
pub fn record_request(status: u16, endpoint: &'static str) {
    metrics::counter!(REQUESTS_TOTAL, "status" => status.to_string(), "endpoint" => endpoint).increment(1);
}

pub fn record_usage(prompt_tokens: u32, cached_tokens: u32, completion_tokens: u32) {
    metrics::counter!(PROMPT_TOKENS_TOTAL).increment(u64::from(prompt_tokens));
    metrics::counter!(CACHED_PROMPT_TOKENS_TOTAL).increment(u64::from(cached_tokens));
    metrics::counter!(COMPLETION_TOKENS_TOTAL).increment(u64::from(completion_tokens));
}

pub fn record_ttft(seconds: f64) {
    metrics::histogram!(TTFT_SECONDS).record(seconds);
}

/// Records one inter-token sample per token of a chunk, each a share of the chunk's interval.
pub fn record_inter_token(chunk_interval_seconds: f64, tokens: usize) {
    if tokens == 0 {
        return;
    }
    let per_token = chunk_interval_seconds / tokens as f64;
    let h = metrics::histogram!(INTER_TOKEN_SECONDS);
    for _ in 0..tokens {
        h.record(per_token);
    }
}

pub fn record_queue_depth(depth: usize) {
    metrics::gauge!(QUEUE_DEPTH).set(depth as f64);
}

pub fn record_in_flight(requests: usize) {
    metrics::gauge!(IN_FLIGHT).set(requests as f64);
}

pub fn record_e2e(seconds: f64) {
    metrics::histogram!(E2E_SECONDS).record(seconds);
}

/// Counts one request failed by a gateway->engine deadline (`accept` or `first_token`).
pub fn record_engine_deadline(which: &'static str) {
    metrics::counter!(ENGINE_DEADLINES_TOTAL, "deadline" => which).increment(1);
}

pub fn record_open_connections(open: usize) {
    metrics::gauge!(OPEN_CONNECTIONS).set(open as f64);
}

/// Counts one connection shed at the limit (`evicted` or `refused`).
pub fn record_connection_shed(how: &'static str) {
    metrics::counter!(CONNECTIONS_SHED_TOTAL, "how" => how).increment(1);
}
