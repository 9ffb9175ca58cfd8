//! Serving: the Cache service plus grpc.health.v1, over a Unix socket (the default) or TCP
//! (`proto::transport::Listener`). HTTP/2 keepalive pings let the server notice an engine
//! host that vanished without closing its socket, which ends that engine's session. With an
//! auth token every Cache call must carry it; the health service stays open (it tells
//! nothing but serving or not).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use proto::cache::v1::cache_server::CacheServer;
pub use proto::transport::{AuthToken, Listener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::cache::Cache;
use crate::error::CacheError;
use crate::service::CacheService;

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves until `shutdown` resolves, then ends every session stream and drains.
pub async fn serve(
    cache: Arc<Cache>,
    listener: Listener,
    auth: AuthToken,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CacheError> {
    listener.warn_if_open(&auth, "cache-service");
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<CacheServer<CacheService>>().await;
    let router = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(health_service)
        .add_service(CacheServer::with_interceptor(CacheService::new(cache.clone()), move |request| {
            auth.check(request)
        }));
    let signal = {
        let cache = cache.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down: ending engine sessions");
            health.set_not_serving::<CacheServer<CacheService>>().await;
            cache.begin_shutdown();
        }
    };
    match listener {
        Listener::Tcp(l) => {
            let incoming = TcpIncoming::from(l).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, signal).await?;
        }
        Listener::Unix { listener, path } => {
            router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), signal).await?;
            drop(path);
        }
    }
    Ok(())
}
