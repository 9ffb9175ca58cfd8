//! Typed client for one engine-service: `Generate`, `Abort`, `Info`, and a liveness probe.
//!
//! The channel is lazy: creating a client never fails on an unreachable engine, and a
//! request to one fails with `Unavailable` (-> 503). The channel reconnects by itself, so an
//! engine restart is survived without restarting the gateway. Cloning is cheap (one channel).

use std::time::Duration;

use proto::engine::v1::{
    AbortRequest, GenerateRequest, GenerateResponse, InfoRequest, InfoResponse, StatusRequest, StatusResponse,
    engine_client::EngineClient as RawClient,
};
use proto::transport::{AuthToken, Dial};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Largest gRPC message accepted from the engine: `Info` carries a whole tokenizer.json,
/// which passes 10 MB for 250K-token vocabularies.
const MAX_DECODING_MESSAGE_BYTES: usize = 128 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("invalid engine endpoint `{0}`: {1}")]
    Invalid(String, String),
    #[error("{0}")]
    Token(#[from] proto::transport::TransportError),
}

/// The engine as `/health` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineHealth {
    Ok,
    /// Serving, but uncached: `cache` is "degraded" (the cache-service stalls) or "detached"
    /// (it is gone), with the engine's reason.
    Degraded {
        cache: &'static str,
        reason: String,
    },
    /// The engine does not answer.
    Down,
}

#[derive(Clone, Debug)]
pub struct EngineClient {
    raw: RawClient<InterceptedService<Channel, AuthToken>>,
    channel: Channel,
    auth: AuthToken,
}

impl EngineClient {
    /// A lazy client for `unix:/path/to.sock` or `http://host:port` (or https), without an
    /// auth token.
    pub fn new(endpoint: &str) -> Result<EngineClient, EndpointError> {
        EngineClient::with_token(endpoint, AuthToken::none())
    }

    /// A lazy client that sends `auth` on every call (an engine with a token requires it).
    pub fn with_token(endpoint: &str, auth: AuthToken) -> Result<EngineClient, EndpointError> {
        let channel = Dial::new(endpoint, Duration::from_secs(5))
            .map_err(|e| EndpointError::Invalid(endpoint.to_owned(), e.to_string()))?
            .lazy();
        let raw = RawClient::with_interceptor(channel.clone(), auth.clone())
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES);
        Ok(EngineClient { raw, channel, auth })
    }

    pub async fn info(&self) -> Result<InfoResponse, tonic::Status> {
        Ok(self.raw.clone().info(InfoRequest {}).await?.into_inner())
    }

    /// Calls `Info` until it answers, backing off from 100 ms to 2 s, for at most `timeout`.
    pub async fn info_with_retry(&self, timeout: Duration) -> Result<InfoResponse, tonic::Status> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.info().await {
                Ok(info) => return Ok(info),
                Err(status) if tokio::time::Instant::now() + backoff < deadline => {
                    tracing::info!(code = ?status.code(), message = status.message(), "engine not ready; retrying Info");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(status) => return Err(status),
            }
        }
    }

    pub async fn generate(
        &self,
        request: GenerateRequest,
    ) -> Result<tonic::Streaming<GenerateResponse>, tonic::Status> {
        Ok(self.raw.clone().generate(request).await?.into_inner())
    }

    pub async fn abort(&self, request_id: String) -> Result<bool, tonic::Status> {
        Ok(self.raw.clone().abort(AbortRequest { request_id }).await?.into_inner().found)
    }

    /// What `/health` says about the engine: whether it answers within `timeout` and how its
    /// cache link is. An engine without `Status` (an older build) is asked [`Self::is_alive`].
    pub async fn health(&self, timeout: Duration) -> EngineHealth {
        use proto::engine::v1::status_response::Cache;
        let probe = async {
            match self.raw.clone().status(StatusRequest { metrics: false }).await {
                Ok(resp) => {
                    let resp = resp.into_inner();
                    match Cache::try_from(resp.cache) {
                        Ok(Cache::Degraded) => EngineHealth::Degraded { cache: "degraded", reason: resp.reason },
                        Ok(Cache::Detached) => EngineHealth::Degraded { cache: "detached", reason: resp.reason },
                        _ => EngineHealth::Ok,
                    }
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    if self.is_alive(timeout).await {
                        EngineHealth::Ok
                    } else {
                        EngineHealth::Down
                    }
                }
                Err(_) => EngineHealth::Down,
            }
        };
        tokio::time::timeout(timeout, probe).await.unwrap_or(EngineHealth::Down)
    }

    /// The engine's `Status` with its own and its cache-service's Prometheus pages (the
    /// status page), within `timeout`.
    pub async fn status_with_metrics(&self, timeout: Duration) -> Result<StatusResponse, tonic::Status> {
        let mut raw = self.raw.clone();
        match tokio::time::timeout(timeout, raw.status(StatusRequest { metrics: true })).await {
            Ok(resp) => Ok(resp?.into_inner()),
            Err(_) => Err(tonic::Status::deadline_exceeded("the engine did not answer Status in time")),
        }
    }

    /// True when the engine answers a gRPC call within `timeout`. Uses the standard health
    /// service; an engine without it still proves liveness by answering `Abort` for an
    /// unknown id (a documented no-op), so `Info`'s large payload is never fetched here.
    pub async fn is_alive(&self, timeout: Duration) -> bool {
        let probe = async {
            let mut health = tonic_health::pb::health_client::HealthClient::with_interceptor(
                self.channel.clone(),
                self.auth.clone(),
            );
            match health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await {
                Ok(resp) => {
                    resp.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => self.abort(String::new()).await.is_ok(),
                Err(_) => false,
            }
        };
        tokio::time::timeout(timeout, probe).await.unwrap_or(false)
    }
}
