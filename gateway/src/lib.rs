//! gateway: the OpenAI-compatible HTTP API in front of one engine-service.
//!
//! Renders the model's chat template, tokenizes, validates against the model's limits,
//! streams token ids from the engine's `Generate`, detokenizes incrementally, applies stop
//! strings and reports usage (with cached prompt tokens). The engine's `Info` is the single
//! source of truth for the model (tokenizer, template, context length).
//!
//! Public API: [`Config`] (flags/TOML), [`AppState::connect`] / [`AppState::from_info`],
//! [`app`] (the axum router), [`run`] (serve until SIGINT/SIGTERM) and [`run_until`].

pub mod anthropic;
pub mod chat;
pub mod completions;
pub mod config;
pub mod engine_client;
pub mod error;
pub mod generation;
pub mod limits;
pub mod messages;
pub mod metrics;
pub mod openai;
pub mod responses;
pub mod routes;
pub mod routing;
pub mod server;
pub mod state;
pub mod status;
pub mod text;
pub mod tools;
pub mod validate;

use std::future::Future;
use std::time::Duration;

pub use config::{Cli, Config};
pub use engine_client::EngineClient;
pub use error::GatewayError;
pub use routes::app;
pub use state::{AppState, StartupError};

/// Serves until SIGINT or SIGTERM, then drains in-flight requests.
pub async fn run(config: Config) -> Result<(), StartupError> {
    run_until(config, shutdown_signal()).await
}

/// Connects to the engine, binds `config.listen`, prints `http://<addr>/v1` on stdout once
/// listening (the real port when 0 was asked), and serves until `shutdown` completes.
pub async fn run_until(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartupError> {
    let listen = config.listen;
    let state = AppState::connect(config).await?;
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|source| StartupError::Bind { addr: listen, source })?;
    let addr = listener.local_addr().map_err(|source| StartupError::Bind { addr: listen, source })?;
    let metrics_handle = state.inner.metrics.clone();
    let upkeep = tokio::spawn(async move {
        // Histograms are drained into their buckets here rather than on every scrape.
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            metrics_handle.run_upkeep();
        }
    });
    if state.inner.api_keys.is_empty() && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "listening on a non-loopback address without API keys: anyone who can reach it can use the model (set --api-keys or --api-keys-file)"
        );
    }
    tracing::info!(%addr, auth = !state.inner.api_keys.is_empty(), "gateway listening");
    println!("http://{addr}/v1");
    proto::systemd::notify_ready(&format!("serving http://{addr}/v1"));
    let shutdown = async move {
        shutdown.await;
        proto::systemd::notify_stopping();
    };
    let limits = server::ConnectionLimits {
        max_connections: state.config().max_connections,
        header_read_timeout: state.config().header_read_timeout,
    };
    let served = server::serve(listener, app(state), limits, shutdown).await.map_err(StartupError::Serve);
    upkeep.abort();
    tracing::info!("gateway stopped");
    served
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown signal received");
}
