//! Accepting HTTP connections so that slow or flooding clients cannot starve the others.
//!
//! - Headers must arrive within `header_read_timeout` (hyper's own timer; also bounds an idle
//!   keep-alive connection between requests).
//! - At most `max_connections` are open. When a new one arrives at the limit, the oldest
//!   connection that has not yet sent a complete request (head and body) is closed to make
//!   room: a client that dribbles its headers or body, or opens sockets and says nothing,
//!   can only push out others of its kind, while a normal client, whose request arrives
//!   within milliseconds, is past that point before a flood can reach it. Only when every open
//!   connection is busy with a request is the newcomer answered 503 and closed at once
//!   (never left waiting in the backlog).
//! - The request body's deadline is in `routes` (`read_body_within`: 408).
//!
//! Graceful shutdown: stop accepting, let every connection finish its request, then return.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

use crate::error::GatewayError;
use crate::metrics;

/// How long the refusal of a connection over the limit may take to write.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause after a failed accept (out of file descriptors): the error repeats until one closes.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// What `serve` enforces per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

/// Open connections, and the ones still waiting for their first complete request
/// (oldest first), each with the handle that closes it.
#[derive(Default)]
struct Connections {
    open: AtomicUsize,
    waiting: Mutex<BTreeMap<u64, Arc<Notify>>>,
    all_closed: Notify,
}

impl Connections {
    /// Closes the oldest connection without a complete request; false if there is none.
    fn evict_oldest_waiting(&self) -> bool {
        let victim = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).pop_first();
        match victim {
            Some((_, close)) => {
                close.notify_one();
                true
            }
            None => false,
        }
    }

    fn opened(&self, id: u64, close: Arc<Notify>) {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).insert(id, close);
        metrics::record_open_connections(self.open.load(Ordering::Acquire));
    }

    /// The connection sent a complete request: it is no longer a candidate for eviction.
    fn request_complete(&self, id: u64) {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    fn closed(&self, id: u64) {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let left = self.open.fetch_sub(1, Ordering::AcqRel) - 1;
        metrics::record_open_connections(left);
        if left == 0 {
            self.all_closed.notify_waiters();
        }
    }
}

/// Put on every request by the accept loop. The body reader (`routes::read_body_within`)
/// calls [`RequestArrival::complete`] once the whole request is in; from then on its
/// connection is never shed to make room.
#[derive(Clone)]
pub struct RequestArrival {
    connections: Arc<Connections>,
    id: u64,
}

impl RequestArrival {
    pub fn complete(&self) {
        self.connections.request_complete(self.id);
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let connections = Arc::new(Connections::default());
    let (draining_tx, draining_rx) = watch::channel(false);
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Token events are small writes that should leave at once, not wait for Nagle to
        // coalesce them with the next one.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        if connections.open.load(Ordering::Acquire) >= limits.max_connections {
            if connections.evict_oldest_waiting() {
                metrics::record_connection_shed("evicted");
            } else {
                metrics::record_connection_shed("refused");
                tokio::spawn(refuse(stream, limits.max_connections));
                continue;
            }
        }
        next_id += 1;
        let id = next_id;
        let close = Arc::new(Notify::new());
        connections.opened(id, close.clone());
        tokio::spawn(serve_connection(
            stream,
            app.clone(),
            builder.clone(),
            connections.clone(),
            id,
            close,
            draining_rx.clone(),
        ));
    }
    drop(listener);
    tracing::info!(open = connections.open.load(Ordering::Acquire), "draining connections");
    let _ = draining_tx.send(true);
    loop {
        let all_closed = connections.all_closed.notified();
        if connections.open.load(Ordering::Acquire) == 0 {
            break;
        }
        all_closed.await;
    }
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    builder: Arc<Builder<TokioExecutor>>,
    connections: Arc<Connections>,
    id: u64,
    close: Arc<Notify>,
    mut draining: watch::Receiver<bool>,
) {
    let arrival = RequestArrival { connections: connections.clone(), id };
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(arrival.clone());
        app.clone().oneshot(request)
    });
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut draining_seen = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            // Evicted to make room: dropping the connection closes the socket.
            () = close.notified() => {
                tracing::debug!(id, "closed a connection that sent no complete request, to make room");
                break;
            }
            changed = draining.changed(), if !draining_seen => {
                draining_seen = true;
                if changed.is_ok() {
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
    connections.closed(id);
}

/// Answers a connection over the limit with a 503 in the OpenAI error shape and closes it,
/// so the client learns at once instead of waiting in the kernel's backlog.
async fn refuse(mut stream: TcpStream, limit: usize) {
    let body = serde_json::to_string(&GatewayError::TooManyConnections(limit).to_body()).unwrap_or_default();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent until it closes: closing with unread bytes would reset
        // the connection, and the client could lose the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
