//! Engine metric names (Prometheus via the `metrics` crate) and their descriptions.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const REQUESTS_TOTAL: &str = "edge_engine_requests_total";
pub const PROMPT_TOKENS_TOTAL: &str = "edge_engine_prompt_tokens_total";
pub const CACHED_PROMPT_TOKENS_TOTAL: &str = "edge_engine_cached_prompt_tokens_total";
pub const PREFILL_TOKENS_TOTAL: &str = "edge_engine_prefill_tokens_total";
pub const GENERATED_TOKENS_TOTAL: &str = "edge_engine_generated_tokens_total";
pub const STEP_SECONDS: &str = "edge_engine_step_seconds";
pub const STEP_TOKENS: &str = "edge_engine_step_tokens";
pub const RUNNING_SEQUENCES: &str = "edge_engine_running_sequences";
pub const WAITING_SEQUENCES: &str = "edge_engine_waiting_sequences";
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "edge_engine_time_to_first_token_seconds";
pub const GRAMMAR_DRAFT_TOKENS_TOTAL: &str = "edge_engine_grammar_draft_tokens_total";
pub const GRAMMAR_FORBIDDEN_DRAFT_TOKENS_TOTAL: &str = "edge_engine_grammar_forbidden_draft_tokens_total";

/// The names llm-d's endpoint picker (Gateway API Inference Extension) scrapes from a vLLM
/// server, published beside ours so it scores this engine the same way: queue depth, running
/// requests, KV-cache use (0..1) and the cache's shape. `gpu_cache_usage_perc` is the name
/// vLLM used before `kv_cache_usage_perc`, which older pickers still read.
pub mod vllm {
    pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
    pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
    pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
    pub const GPU_CACHE_USAGE_PERC: &str = "vllm:gpu_cache_usage_perc";
    pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
}

/// The vLLM-named gauges, registered once with the model's label: the step loop sets them
/// every iteration, which must not cost a label allocation and a registry lookup each time.
struct VllmGauges {
    running: metrics::Gauge,
    waiting: metrics::Gauge,
    kv_usage: metrics::Gauge,
    gpu_usage: metrics::Gauge,
}

static VLLM_GAUGES: std::sync::OnceLock<VllmGauges> = std::sync::OnceLock::new();

/// KV pages this engine's sequences hold, of `capacity`: the usage llm-d weighs.
pub fn record_kv_usage(held_pages: usize, capacity: usize) {
    let usage = if capacity == 0 { 0.0 } else { (held_pages as f64 / capacity as f64).min(1.0) };
    if let Some(g) = VLLM_GAUGES.get() {
        g.kv_usage.set(usage);
        g.gpu_usage.set(usage);
    }
}

pub fn record_queue(running: usize, waiting: usize) {
    metrics::gauge!(RUNNING_SEQUENCES).set(running as f64);
    metrics::gauge!(WAITING_SEQUENCES).set(waiting as f64);
    if let Some(g) = VLLM_GAUGES.get() {
        g.running.set(running as f64);
        g.waiting.set(waiting as f64);
    }
}

/// The served model (the `model_name` label vLLM puts on its series) and the KV cache's
/// shape, as `vllm:cache_config_info{block_size,num_gpu_blocks}` (value 1). Published once
/// the model is loaded and the store is linked.
pub fn publish_model(model_name: &str, page_tokens: usize, capacity_pages: usize) {
    let gauge = |name: &'static str| metrics::gauge!(name, "model_name" => model_name.to_owned());
    let _ = VLLM_GAUGES.set(VllmGauges {
        running: gauge(vllm::NUM_REQUESTS_RUNNING),
        waiting: gauge(vllm::NUM_REQUESTS_WAITING),
        kv_usage: gauge(vllm::KV_CACHE_USAGE_PERC),
        gpu_usage: gauge(vllm::GPU_CACHE_USAGE_PERC),
    });
    metrics::gauge!(
        vllm::CACHE_CONFIG_INFO,
        "model_name" => model_name.to_owned(),
        "block_size" => page_tokens.to_string(),
        "num_gpu_blocks" => capacity_pages.to_string()
    )
    .set(1.0);
    record_queue(0, 0);
    record_kv_usage(0, capacity_pages);
}

/// Buckets of the `_seconds` histograms: a CPU step of a small model takes ~1 ms, a 27B
/// prefill chunk seconds; time to first token up to a minute.
pub const LATENCY_BUCKETS_SECONDS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets of the count histograms (tokens per step, tree nodes, accepted lengths).
pub const COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> = std::sync::OnceLock::new();

/// Installs the Prometheus recorder, with histograms (not summaries) so dashboards can
/// aggregate and take quantiles over any window (`histogram_quantile`). Call inside a Tokio
/// runtime; [`serve_exporter`] publishes it.
pub fn install_recorder() -> Result<(), metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS_SECONDS)?
        .set_buckets(COUNT_BUCKETS)?
        .build_recorder();
    let handle = recorder.handle();
    let _ = HANDLE.set(handle.clone());
    metrics::set_global_recorder(recorder)?;
    // Histograms are drained into their buckets here rather than on every scrape.
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            handle.run_upkeep();
        }
    });
    Ok(())
}

/// Serves the recorder's page on `addr` (any path; Prometheus asks for `/metrics`). With
/// `wait_for_port` (an engine taking over from another, which holds the port until it has
/// drained) a port in use is retried in the background until it is free; otherwise binding
/// fails here.
pub async fn serve_exporter(addr: std::net::SocketAddr, wait_for_port: bool) -> std::io::Result<()> {
    let app = axum::Router::new().fallback(|| async {
        ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], render())
    });
    let serve = |listener: tokio::net::TcpListener| async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    };
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
            tokio::spawn(serve(listener));
        }
        Err(e) if wait_for_port && e.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::info!(%addr, "metrics port in use (the engine being replaced); serving it once free");
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                    if let Ok(listener) = tokio::net::TcpListener::bind(addr).await {
                        tracing::info!(%addr, "metrics listening");
                        serve(listener).await;
                        return;
                    }
                }
            });
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// The exporter's page as `/metrics` serves it (empty when no exporter was installed), for
/// the `Status` call the gateway's status page makes.
pub fn render() -> String {
    HANDLE.get().map(|h| h.render()).unwrap_or_default()
}

pub fn describe() {
    describe_counter!(REQUESTS_TOTAL, "Finished sequences, by finish reason");
    describe_counter!(PROMPT_TOKENS_TOTAL, Unit::Count, "Prompt tokens of finished sequences");
    describe_counter!(CACHED_PROMPT_TOKENS_TOTAL, Unit::Count, "Prompt tokens served from the prefix cache");
    describe_counter!(PREFILL_TOKENS_TOTAL, Unit::Count, "Prompt tokens run through prefill");
    describe_counter!(GENERATED_TOKENS_TOTAL, Unit::Count, "Generated tokens");
    describe_histogram!(STEP_SECONDS, Unit::Seconds, "Wall time of one forward step");
    describe_histogram!(STEP_TOKENS, Unit::Count, "Tokens processed in one forward step");
    describe_gauge!(RUNNING_SEQUENCES, "Sequences in the running batch");
    describe_gauge!(WAITING_SEQUENCES, "Sequences waiting for admission");
    describe_histogram!(TIME_TO_FIRST_TOKEN_SECONDS, Unit::Seconds, "Arrival to first generated token");
    describe_counter!(
        GRAMMAR_DRAFT_TOKENS_TOTAL,
        Unit::Count,
        "Draft tokens verified below a node of a grammar-constrained sequence"
    );
    describe_counter!(
        GRAMMAR_FORBIDDEN_DRAFT_TOKENS_TOTAL,
        Unit::Count,
        "Of those, drafts the grammar forbade (never accepted; the tree could have left them out)"
    );
    // Published at zero, so dashboards show a flat line, not "no data", before the first
    // request (and for rare events, until the first one).
    for counter in [
        PROMPT_TOKENS_TOTAL,
        CACHED_PROMPT_TOKENS_TOTAL,
        PREFILL_TOKENS_TOTAL,
        GENERATED_TOKENS_TOTAL,
        crate::step::PREEMPTIONS_TOTAL,
        crate::speculative::metric::DRAFTS_TOTAL,
    ] {
        metrics::counter!(counter).increment(0);
    }
    for kind in ["full_page", "partial_page"] {
        metrics::counter!(crate::step::CACHED_PROMPT_TOKENS_BY_KIND, "kind" => kind).increment(0);
    }
    for op in ["lookup", "allocate", "allocate_state"] {
        metrics::counter!(crate::memory::deadline::CACHE_TIMEOUTS_TOTAL, "op" => op).increment(0);
    }
    metrics::gauge!(RUNNING_SEQUENCES).set(0.0);
    metrics::gauge!(WAITING_SEQUENCES).set(0.0);
    describe_gauge!(
        vllm::NUM_REQUESTS_WAITING,
        "Requests waiting to be admitted (llm-d's queue signal; = edge_engine_waiting_sequences)"
    );
    describe_gauge!(vllm::NUM_REQUESTS_RUNNING, "Requests in the running batch (= edge_engine_running_sequences)");
    describe_gauge!(
        vllm::KV_CACHE_USAGE_PERC,
        "KV pages held by this engine's requests, of the pages it leases from (0..1)"
    );
    describe_gauge!(vllm::GPU_CACHE_USAGE_PERC, "The same as vllm:kv_cache_usage_perc (vLLM's older name)");
    describe_gauge!(
        vllm::CACHE_CONFIG_INFO,
        "The KV cache's shape: block_size (tokens per page), num_gpu_blocks (pages); value 1"
    );
}
