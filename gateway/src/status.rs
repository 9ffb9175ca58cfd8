//! The live status page: `GET /` and `/status` serve one self-contained HTML file (styles,
//! script and charts inline, nothing fetched from elsewhere), which polls `GET /status/data`
//! every two seconds. That JSON holds the served model, the uptime, the engine's state and
//! the three services' Prometheus pages as they are at that moment (the engine's and the
//! cache-service's come through the engine's `Status` call, over the internal socket), so the
//! page computes every number from the same series `/metrics` and the dashboards read.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::AppState;

const PAGE: &str = include_str!("status/page.html");

/// How long the data call waits for the engine (and, through it, the cache-service).
const ENGINE_STATUS_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn page() -> Response {
    let mut resp = PAGE.into_response();
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    // Everything is inline; nothing may be loaded from elsewhere.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

pub async fn data(State(state): State<AppState>) -> Response {
    let model = state.model();
    let (engine, engine_metrics, cache_metrics) =
        match state.inner.engines.primary().status_with_metrics(ENGINE_STATUS_TIMEOUT).await {
            Ok(status) => {
                use proto::engine::v1::status_response::Cache;
                let cache = match Cache::try_from(status.cache) {
                    Ok(Cache::None) => "none",
                    Ok(Cache::Attached) => "attached",
                    Ok(Cache::Degraded) => "degraded",
                    Ok(Cache::Detached) => "detached",
                    _ => "unknown",
                };
                (
                    json!({"up": true, "cache": cache, "reason": status.reason}),
                    status.engine_metrics,
                    status.cache_metrics,
                )
            }
            Err(status) => {
                (json!({"up": false, "cache": "unknown", "reason": status.message()}), String::new(), String::new())
            }
        };
    let body = json!({
        "model": model.id,
        "names": model.names,
        "backend": model.backend,
        "architecture": model.architecture,
        "context_length": model.context_length,
        "uptime_seconds": state.inner.started.elapsed().as_secs_f64(),
        "max_concurrent_requests": state.config().max_concurrent_requests,
        "engine": engine,
        "routing": state.inner.engines.policy().name(),
        "engines": state.inner.engines.engines().iter().map(|e| json!({
            "endpoint": e.endpoint,
            "state": e.state_name(),
            "in_flight": e.in_flight(),
        })).collect::<Vec<_>>(),
        "metrics": {
            "gateway": crate::routes::metrics_text(&state),
            "engine": engine_metrics,
            "cache": cache_metrics,
        },
    });
    let mut resp = Json(body).into_response();
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
