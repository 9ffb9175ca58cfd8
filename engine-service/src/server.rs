//! Process wiring: load the model, attach to the cache-service, start the step loop
//! thread and the gRPC server (Engine + grpc.health.v1).

use std::sync::Arc;
use std::time::Duration;

use proto::engine::v1 as pb;
use proto::transport::{AuthToken, Listener};

use crate::EngineError;
use crate::config::EngineConfig;
use crate::memory::store::{AttachSpec, CacheLink, PageStore, keep_attached};
use crate::service::EngineService;
use crate::step::{StepLimits, StepLoop};

/// How long the engine waits for the cache-service at startup.
const CACHE_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the engine checks its cache session (and retries attaching once it died).
const CACHE_RECONNECT_POLL: Duration = Duration::from_millis(250);

/// Serves until `shutdown` resolves.
pub async fn run(
    config: EngineConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), EngineError> {
    crate::metrics::describe();
    let load_config = config.clone();
    let loaded = tokio::task::spawn_blocking(move || crate::backend::device::load(&load_config))
        .await
        .map_err(|e| EngineError::Internal(format!("model loader panicked: {e}")))??;
    let backend = loaded.backend;
    let tokenizer = loaded.tokenizer;
    let fingerprint = loaded.fingerprint;
    let hparams = backend.hparams().clone();
    let layout = backend.kv_layout();
    tracing::info!(
        model = %config.model.display(),
        backend = backend.name(),
        layers = hparams.n_layers,
        context = hparams.context_length,
        threads = config.threads,
        kv_dtype = layout.dtype.name(),
        kv_bytes_per_token = layout.bytes_per_token(),
        fingerprint = %fingerprint,
        "model loaded"
    );

    let auth = AuthToken::from_optional_file(config.auth_token_file.as_deref())
        .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
    // Bound before attaching: a socket another engine serves fails here, not after the attach.
    // With --takeover the socket is bound beside the live one and moved onto it when ready.
    let bound = if config.takeover {
        Listener::bind_for_takeover(&config.listen).await
    } else {
        Listener::bind(&config.listen).await
    };
    let mut listener = bound.map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
    let (store, link) = match &config.cache {
        Some(endpoint) => {
            let spec = AttachSpec {
                endpoint: endpoint.clone(),
                auth: auth.clone(),
                fingerprint: fingerprint.clone(),
                page_bytes: layout.page_bytes() as u64,
                page_tokens: layout.page_tokens as u32,
            };
            let session = attach_cache(&spec).await?;
            let link = CacheLink::with_call_timeout(config.cache_call_timeout);
            link.set(Arc::new(session));
            // A restarted cache-service is re-attached in the background; meanwhile the
            // engine serves uncached (see memory::store).
            tokio::spawn(keep_attached(Arc::downgrade(&link), spec, CACHE_RECONNECT_POLL));
            let handle = tokio::runtime::Handle::current();
            (PageStore::linked(layout, config.local_pages, link.clone(), handle), Some(link))
        }
        None => {
            tracing::warn!("running without a cache-service: no prefix reuse across requests");
            (PageStore::local(layout, config.local_pages), None)
        }
    };

    let model_id =
        config.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".to_string());
    let info = pb::InfoResponse {
        model_id,
        context_length: hparams.context_length as u32,
        tokenizer_json: tokenizer.json.clone(),
        chat_template: tokenizer.chat_template.clone(),
        bos_token_id: tokenizer.bos_token_id,
        eos_token_ids: tokenizer.eos_token_ids.clone(),
        bos_token: tokenizer.bos_token.clone(),
        eos_token: tokenizer.eos_token.clone(),
        architecture: hparams.architecture.clone(),
        model_fingerprint: fingerprint.clone(),
        backend: backend.name().to_string(),
        recurrent_state: backend.state_bytes() > 0,
        // Filled in by `EngineService::new`, from the limits it checks.
        limits: None,
    };

    crate::metrics::publish_model(&info.model_id, store.page_tokens(), store.capacity_pages());
    let limits = StepLimits {
        max_batch_tokens: config.max_batch_tokens,
        max_running: config.max_running,
        context_length: hparams.context_length,
        page_tokens: layout.page_tokens,
        eos_token_ids: tokenizer.eos_token_ids.clone(),
    };
    let state_bytes = backend.state_bytes();
    let (commands_tx, commands_rx) = std::sync::mpsc::channel();
    let returns = store.returns();
    let step_loop = StepLoop::new(backend, store, limits, commands_rx)
        .with_speculation(config.speculation.clone())
        .with_state_snapshots(config.state_snapshot_every);
    let step_thread = std::thread::Builder::new()
        .name("step-loop".into())
        .spawn(move || step_loop.run())
        .map_err(|e| EngineError::Internal(format!("cannot start the step loop thread: {e}")))?;

    let service = EngineService::new(
        commands_tx,
        info,
        link,
        returns,
        hparams.vocab_size,
        state_bytes,
        config.max_running + config.max_queued,
    );
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<pb::engine_server::EngineServer<EngineService>>().await;

    let serving = |endpoint: &str| format!("serving {} on {endpoint}", config.model.display());
    if config.takeover {
        let status = serving(&config.listen.to_string());
        listener
            .take_over(&config.listen, || proto::systemd::notify_took_over(&status))
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        tracing::info!(endpoint = %config.listen, "took the socket over: new calls come here");
    } else {
        proto::systemd::notify_ready(&serving(&listener.endpoint()));
    }
    let endpoint = listener.endpoint();
    // Generate on an open engine goes around the gateway's API keys.
    listener.warn_if_open(&auth, "engine-service");
    tracing::info!(%endpoint, "engine-service listening");
    // An engine whose socket a successor took over is no longer the unit's main process:
    // STOPPING=1 from it would make systemd stop the unit, successor included.
    let ownership = listener.ownership();
    let shutdown = async move {
        shutdown.await;
        if ownership.still_ours() {
            proto::systemd::notify_stopping();
        } else {
            tracing::info!("a successor serves this socket: draining without telling the service manager");
        }
    };
    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(pb::engine_server::EngineServer::with_interceptor(service, move |request| auth.check(request)));
    let served = match listener {
        Listener::Tcp(l) => {
            let incoming = tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, shutdown).await
        }
        Listener::Unix { listener, path: _socket_file } => {
            router
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), shutdown)
                .await
        }
    };
    served.map_err(|e| EngineError::Internal(format!("gRPC server: {e}")))?;
    // The service (and with it the last command sender) is gone: the loop drains and exits.
    let _ = tokio::task::spawn_blocking(move || step_thread.join()).await;
    Ok(())
}

async fn attach_cache(spec: &AttachSpec) -> Result<cache_client::client::CacheSession, EngineError> {
    let endpoint = &spec.endpoint;
    let deadline = tokio::time::Instant::now() + CACHE_CONNECT_TIMEOUT;
    let mut delay = Duration::from_millis(100);
    loop {
        match spec.attach().await {
            Ok(session) => {
                tracing::info!(%endpoint, "attached to the cache-service");
                return Ok(session);
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::info!(%endpoint, error = %e, "cache-service not ready; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(EngineError::Cache(format!("cannot attach to {endpoint}: {e}"))),
        }
    }
}
