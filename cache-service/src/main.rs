//! cache-service binary: parse config, create the arena, serve until SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use cache_service::arena::{Arena, ArenaOptions};
use cache_service::cache::Cache;
use cache_service::config::{CacheArgs, CacheConfig};
use cache_service::server::{AuthToken, Listener, serve};
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// How long graceful shutdown may wait for connections to drain.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        // No colour codes in journald or a log file.
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let config = CacheConfig::from_args(CacheArgs::parse())?;

    if let Some(addr) = config.metrics_listen {
        cache_service::metrics::install_exporter(addr)
            .with_context(|| format!("starting the Prometheus listener on {addr}"))?;
        cache_service::metrics::describe();
        tracing::info!(%addr, "metrics listening");
    }

    let arena = Arena::create(&ArenaOptions {
        path: config.arena_path.clone(),
        file_bytes: config.arena_bytes,
        reserve: config.reserve_arena,
    })?;
    tracing::info!(path = %config.arena_path.display(), bytes = config.arena_bytes, "arena created");
    let cache = match &config.kv_events {
        Some((endpoint, topic)) => {
            let publisher = cache_service::events::Publisher::bind(endpoint, topic.clone())
                .await
                .with_context(|| format!("binding the KV event endpoint {endpoint}"))?;
            tracing::info!(%endpoint, %topic, "publishing KV events");
            Cache::with_kv_events(arena, config.page_tokens, publisher)
        }
        None => Cache::new(arena, config.page_tokens),
    };
    // Publish every series at zero so dashboards see them before the first engine attaches.
    cache_service::metrics::record(&Default::default(), &cache.stats());
    let auth = AuthToken::from_optional_file(config.auth_token_file.as_deref())?;
    let listener = Listener::bind(&config.listen).await?;
    tracing::info!(endpoint = %listener.endpoint(), "cache-service listening");
    proto::systemd::notify_ready(&format!("serving on {}", listener.endpoint()));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(cache.clone(), listener, auth, async move {
        let _ = stop_rx.await;
    }));
    shutdown_signal().await?;
    proto::systemd::notify_stopping();
    let _ = stop_tx.send(());
    match tokio::time::timeout(DRAIN_TIMEOUT, server).await {
        Ok(joined) => joined.context("server task")??,
        Err(_) => tracing::warn!("connections did not drain in time; exiting anyway"),
    }
    // The arena file goes when the last reference to the cache drops; remove it now in case a
    // connection task still holds one.
    drop(cache);
    if let Err(e) = std::fs::remove_file(&config.arena_path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(error = %e, "could not remove the arena file");
    }
    tracing::info!("cache-service stopped");
    Ok(())
}

async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}
