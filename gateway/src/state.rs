//! Shared state of the HTTP app: engine client, the model's text side and facts, limits.
//!
//! Built once at startup from the engine's `Info` (the single source of truth for the
//! model). Cheap to clone (one `Arc`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusHandle;
use proto::engine::v1::InfoResponse;
use proto::transport::AuthToken;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::engine_client::{EndpointError, EngineClient};
use crate::error::GatewayError;
use crate::routing::EnginePool;
use crate::text::{ChatTemplate, Text, TextTokenizer};
use crate::tools::ToolFormat;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("engine Info failed: {}", .0.message())]
    EngineInfo(tonic::Status),
    #[error("engine Info is unusable: {0}")]
    BadInfo(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("server failed: {0}")]
    Serve(std::io::Error),
}

/// Facts about the served model the request path needs.
#[derive(Debug, Clone)]
pub struct ModelFacts {
    /// The id responses report: the first served name, else the engine's model id.
    pub id: String,
    /// Every name requests may use without being "another name" (`id` first).
    pub names: Vec<String>,
    pub context_length: u32,
    /// What one request may ask for, as the engine published it.
    pub limits: crate::validate::Limits,
    pub created: u64,
    /// The engine's backend ("cpu", "cuda") and architecture, for the status page.
    pub backend: String,
    pub architecture: String,
}

#[derive(Clone, Debug)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// The engines requests are routed over (one, usually).
    pub engines: EnginePool,
    pub text: Text,
    pub model: ModelFacts,
    pub config: Config,
    pub limiter: Arc<Semaphore>,
    /// Requests waiting for a `limiter` permit.
    pub queued: AtomicUsize,
    pub metrics: PrometheusHandle,
    /// When the gateway came up (the status page's uptime).
    pub started: std::time::Instant,
    pub tool_format: ToolFormat,
    /// Accepted API keys; empty means auth is off.
    pub api_keys: Vec<String>,
    /// Other requested model names already logged (at most `MAX_LOGGED_NAMES`).
    pub logged_model_names: Mutex<HashSet<String>>,
}

/// Bounds the memory a client can make the name log use.
const MAX_LOGGED_NAMES: usize = 256;

/// Decrements the queue depth when a waiter leaves (admitted, timed out or gone).
struct QueueSlot<'a>(&'a AtomicUsize);

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        let depth = self.0.fetch_sub(1, Ordering::AcqRel) - 1;
        crate::metrics::record_queue_depth(depth);
    }
}

impl AppState {
    /// Connects to the configured engines: the first whose `Info` answers (retried until
    /// `config.startup_timeout`) gives the model; the others are routed to once their health
    /// probe finds them serving the same model.
    pub async fn connect(config: Config) -> Result<AppState, StartupError> {
        let auth = AuthToken::from_optional_file(config.auth_token_file.as_deref()).map_err(EndpointError::from)?;
        let clients = config
            .engine_endpoints
            .iter()
            .map(|endpoint| Ok((endpoint.clone(), EngineClient::with_token(endpoint, auth.clone())?)))
            .collect::<Result<Vec<_>, EndpointError>>()?;
        tracing::info!(endpoints = ?config.engine_endpoints, routing = config.routing.name(), "waiting for an engine");
        let timeout = config.startup_timeout;
        let first = clients.iter().enumerate().map(|(i, (_, client))| {
            Box::pin(async move { client.info_with_retry(timeout).await.map(|info| (i, info)) })
        });
        let ((index, info), _) = futures::future::select_ok(first).await.map_err(StartupError::EngineInfo)?;
        let pool = EnginePool::new(clients, config.routing);
        pool.set_up(index, true);
        pool.spawn_health_checks(info.model_fingerprint.clone());
        // Tokenizer and template building is seconds of CPU for big vocabularies.
        tokio::task::spawn_blocking(move || AppState::from_info(config, pool, info))
            .await
            .map_err(|e| StartupError::BadInfo(format!("startup task failed: {e}")))?
    }

    /// State from an `Info` answer already in hand (also what tests use, with one engine).
    pub fn from_info(
        config: Config,
        engines: impl Into<EnginePool>,
        info: InfoResponse,
    ) -> Result<AppState, StartupError> {
        if info.model_id.is_empty() {
            return Err(StartupError::BadInfo("empty model_id".into()));
        }
        if info.context_length == 0 {
            return Err(StartupError::BadInfo("context_length is 0".into()));
        }
        let limits = crate::validate::Limits::from_info(&info).map_err(StartupError::BadInfo)?;
        let tokenizer =
            TextTokenizer::from_json(&info.tokenizer_json).map_err(|e| StartupError::BadInfo(e.to_string()))?;
        let api_keys = config.load_api_keys().map_err(|e| StartupError::BadInfo(e.to_string()))?;
        let tool_format = ToolFormat::detect(&info.chat_template);
        let template = ChatTemplate::new(&info.chat_template, &info.bos_token, &info.eos_token)
            .map_err(|e| StartupError::BadInfo(e.to_string()))?;
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        tracing::info!(
            model = %info.model_id,
            context_length = info.context_length,
            architecture = %info.architecture,
            backend = %info.backend,
            ?tool_format,
            "engine ready"
        );
        let names = if config.served_model_names.is_empty() {
            vec![info.model_id.clone()]
        } else {
            config.served_model_names.clone()
        };
        Ok(AppState {
            inner: Arc::new(Inner {
                engines: engines.into(),
                text: Text { hint_snapshots: info.recurrent_state, ..Text::new(template, tokenizer) },
                model: ModelFacts {
                    id: names[0].clone(),
                    names,
                    context_length: info.context_length,
                    limits,
                    created,
                    backend: info.backend.clone(),
                    architecture: info.architecture.clone(),
                },
                started: std::time::Instant::now(),
                limiter: Arc::new(Semaphore::new(config.max_concurrent_requests)),
                queued: AtomicUsize::new(0),
                config,
                metrics: crate::metrics::install(),
                tool_format,
                api_keys,
                logged_model_names: Mutex::new(HashSet::new()),
            }),
        })
    }

    pub fn model(&self) -> &ModelFacts {
        &self.inner.model
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Checks a request's `model` against the served names (404 only in strict mode); a name
    /// served anyway is logged the first time it is seen.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), GatewayError> {
        let inner = &self.inner;
        let m = crate::validate::check_model(requested, &inner.model.names, inner.config.strict_model_names)?;
        if let crate::validate::ModelMatch::Other(name) = m {
            let mut seen = inner.logged_model_names.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.len() < MAX_LOGGED_NAMES && seen.insert(name.clone()) {
                tracing::info!(requested = %name, served = %inner.model.id, "serving a request for another model name");
            }
        }
        Ok(())
    }

    /// A concurrency permit: at once if one is free, else after waiting in a queue of at most
    /// `max_queued_requests` (more are answered 429). The caller bounds the wait (deadline).
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, GatewayError> {
        let inner = &self.inner;
        if let Ok(permit) = inner.limiter.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let depth = inner.queued.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = QueueSlot(&inner.queued);
        if depth > inner.config.max_queued_requests {
            drop(slot);
            return Err(GatewayError::Overloaded(inner.config.max_concurrent_requests));
        }
        crate::metrics::record_queue_depth(depth);
        let permit = inner
            .limiter
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| GatewayError::Internal("the request limiter is closed".into()))?;
        drop(slot);
        Ok(permit)
    }

    /// Requests waiting for a slot now.
    pub fn queue_depth(&self) -> usize {
        self.inner.queued.load(Ordering::Acquire)
    }
}
