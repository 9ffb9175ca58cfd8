//! Binding and serving: the Cache service plus grpc.health.v1, over TCP or a Unix socket.
//! HTTP/2 keepalive pings let the server notice an engine host that vanished without
//! closing its socket, which ends that engine's session.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proto::cache::v1::cache_server::CacheServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::cache::Cache;
use crate::config::ListenAddr;
use crate::error::CacheError;
use crate::service::CacheService;

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A bound listening socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix { listener: UnixListener, path: PathBuf },
}

impl Listener {
    pub async fn bind(addr: &ListenAddr) -> Result<Listener, CacheError> {
        match addr {
            ListenAddr::Tcp(a) => {
                TcpListener::bind(a).await.map(Listener::Tcp).map_err(|e| CacheError::io(format!("binding {a}"), e))
            }
            ListenAddr::Unix(path) => {
                if path.exists() {
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(CacheError::InvalidArgument(format!(
                            "{} is in use by a running server",
                            path.display()
                        )));
                    }
                    std::fs::remove_file(path)
                        .map_err(|e| CacheError::io(format!("removing stale socket {}", path.display()), e))?;
                }
                let listener =
                    UnixListener::bind(path).map_err(|e| CacheError::io(format!("binding {}", path.display()), e))?;
                // Engines run as the same user, like the arena file's 0600.
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| CacheError::io(format!("restricting {}", path.display()), e))?;
                Ok(Listener::Unix { listener, path: path.clone() })
            }
        }
    }

    /// The endpoint a client passes to [`crate::client::CacheClient::connect`].
    pub fn endpoint(&self) -> String {
        match self {
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("http://{a}"),
                Err(_) => "http://127.0.0.1:0".to_string(),
            },
            Listener::Unix { path, .. } => format!("unix:{}", path.display()),
        }
    }
}

/// Serves until `shutdown` resolves, then ends every session stream and drains.
pub async fn serve(
    cache: Arc<Cache>,
    listener: Listener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CacheError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<CacheServer<CacheService>>().await;
    let router = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(health_service)
        .add_service(CacheServer::new(CacheService::new(cache.clone())));
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
            let result = router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), signal).await;
            let _ = std::fs::remove_file(&path);
            result?;
        }
    }
    Ok(())
}
