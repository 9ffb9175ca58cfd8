//! Deadlines on engine -> cache-service calls. A stalled cache-service (stopped, swapping,
//! starved of CPU) must cost a sequence its cache hits, never its progress: each table call
//! gets a deadline, and on a miss the caller goes on uncached while the call itself keeps
//! running as a task. Whatever it leased or pinned when it finally answers is handed to an
//! `on_late` cleanup, so a missed deadline leaks nothing.

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;

/// Calls that missed their deadline, by `op` (counter).
pub const CACHE_TIMEOUTS_TOTAL: &str = "edge_engine_cache_timeouts_total";

/// Runs `call` as a task and waits for it at most `deadline`. `None` when it missed the
/// deadline (or panicked); its result, when it comes, then goes to `on_late`.
pub async fn within<T, F, L, LF>(deadline: Duration, call: F, on_late: L) -> Option<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
    L: FnOnce(T) -> LF + Send + 'static,
    LF: Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = oneshot::channel();
    tokio::spawn(async move {
        let out = call.await;
        if let Err(out) = tx.send(out) {
            on_late(out).await;
        }
    });
    match tokio::time::timeout(deadline, &mut rx).await {
        Ok(result) => result.ok(),
        Err(_) => {
            // From here on the task's send fails and `on_late` gets the result; one that
            // arrived just now is still ours.
            rx.close();
            rx.try_recv().ok()
        }
    }
}

/// [`within`] from a thread outside the runtime (the step loop).
pub fn within_blocking<T, F, L, LF>(
    runtime: &tokio::runtime::Handle,
    deadline: Duration,
    call: F,
    on_late: L,
) -> Option<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
    L: FnOnce(T) -> LF + Send + 'static,
    LF: Future<Output = ()> + Send + 'static,
{
    runtime.block_on(within(deadline, call, on_late))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn an_answer_in_time_is_returned_and_nothing_is_cleaned_up() {
        let late = Arc::new(AtomicUsize::new(0));
        let l = late.clone();
        let got = within(Duration::from_secs(5), async { 7 }, move |_| async move {
            l.fetch_add(1, Ordering::SeqCst);
        })
        .await;
        assert_eq!(got, Some(7));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(late.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_late_answer_goes_to_the_cleanup() {
        let late = Arc::new(AtomicUsize::new(0));
        let l = late.clone();
        let slow = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            41
        };
        let started = std::time::Instant::now();
        let got = within(Duration::from_millis(20), slow, move |v| async move {
            l.fetch_add(v, Ordering::SeqCst);
        })
        .await;
        assert_eq!(got, None);
        assert!(started.elapsed() < Duration::from_millis(150), "waited past the deadline");
        for _ in 0..100 {
            if late.load(Ordering::SeqCst) == 41 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the late result never reached the cleanup");
    }

    #[test]
    fn the_blocking_form_waits_from_a_plain_thread() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let handle = rt.handle().clone();
        let got = std::thread::spawn(move || {
            within_blocking(&handle, Duration::from_millis(20), std::future::pending::<u8>(), |_| async {})
        })
        .join()
        .unwrap();
        assert_eq!(got, None);
    }
}
