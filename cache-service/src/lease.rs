//! Sessions as leases. `Attach` returns a [`SessionStream`] that owns a [`SessionLease`]:
//! the stream yields `Attached` once and then stays pending for the life of the engine.
//! When the engine goes away (exit, crash, kill -9: the HTTP/2 stream or connection
//! closes), tonic drops the response stream, the lease drops, and every page reference of
//! the session is released. Nothing else ever has to remember to clean up. On shutdown the
//! stream ends instead, so graceful shutdown is not held up by streams that never finish.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use proto::cache::v1::SessionEvent;
use tonic::Status;

use crate::cache::Cache;

/// Ownership of one session; closing happens in `Drop`.
#[derive(Debug)]
pub struct SessionLease {
    cache: Arc<Cache>,
    session_id: u64,
}

impl SessionLease {
    pub(crate) fn new(cache: Arc<Cache>, session_id: u64) -> SessionLease {
        SessionLease { cache, session_id }
    }

    pub fn session_id(&self) -> u64 {
        self.session_id
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        self.cache.close_session(self.session_id);
    }
}

/// The Attach response stream: the first event, then pending until dropped or shutdown.
pub struct SessionStream {
    first: Option<SessionEvent>,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    _lease: SessionLease,
}

impl SessionStream {
    /// `shutdown` resolves when the server is stopping; the stream then ends.
    pub fn new(
        first: SessionEvent,
        lease: SessionLease,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> SessionStream {
        let mut rx = shutdown;
        let shutdown = Box::pin(async move {
            // An error means the sender (the cache) is gone: also a shutdown.
            let _ = rx.wait_for(|stopping| *stopping).await;
        });
        SessionStream { first: Some(first), shutdown, _lease: lease }
    }
}

impl Stream for SessionStream {
    type Item = Result<SessionEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(event) = self.first.take() {
            return Poll::Ready(Some(Ok(event)));
        }
        match self.shutdown.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
