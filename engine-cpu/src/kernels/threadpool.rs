//! A persistent fork-join pool for the compute kernels: `run(f)` calls `f(i, n)` exactly once
//! for every thread index `i` in `0..n` and returns when all calls are done. Index 0 runs on
//! the caller; each other index is claimed either by its worker or, if that worker has not
//! picked the job up by the time the caller finished its own share, by the caller itself
//! (so a descheduled worker on a busy machine costs one share of work, not a time slice).
//!
//! Waiting workers spin for ~[`SPIN_US`] µs (a dispatch then costs well under a microsecond),
//! then yield until [`PARK_AFTER_US`], then park on a condvar: an idle pool burns no CPU.
//!
//! `run` is serialized (concurrent callers wait for each other); calling `run` from inside
//! `f` on the same pool deadlocks and is not allowed. A panic in `f` on a worker is caught
//! and re-raised on the caller after every index has finished.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Busy-poll time of a waiting worker before it starts yielding.
pub const SPIN_US: u64 = 100;
/// Time a waiting worker keeps polling (spinning, then yielding) before it parks.
pub const PARK_AFTER_US: u64 = 2000;

type Job = dyn Fn(usize, usize) + Sync;

#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    n_threads: usize,
    /// Bumped once per `run` (after the job is published).
    generation: Padded<AtomicU64>,
    /// `claimed[i]`: last generation whose index `i` was claimed (by worker i or the caller).
    claimed: Vec<Padded<AtomicU64>>,
    /// Claimed indices of the current job still running.
    pending: Padded<AtomicUsize>,
    /// Points at the caller's `&Job` (on its stack); valid until `pending` reaches zero.
    job: Padded<AtomicPtr<()>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads including the caller (`0` is treated as 1).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            generation: Padded(AtomicU64::new(0)),
            claimed: (0..n_threads).map(|_| Padded(AtomicU64::new(0))).collect(),
            pending: Padded(AtomicUsize::new(0)),
            job: Padded(AtomicPtr::new(std::ptr::null_mut())),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("kernel-{i}"))
                    .spawn(move || worker_loop(&s, i))
                    .expect("spawning a kernel thread")
            })
            .collect();
        ThreadPool { shared, workers, run_lock: Mutex::new(()) }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(thread_index, n_threads)` for every index and returns when all are done.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: &(dyn Fn(usize, usize) + Sync + '_) = &f;
        // Workers see it as `&'static Job`; `run` does not return before they are done with it.
        s.job.0.store(&job as *const &(dyn Fn(usize, usize) + Sync + '_) as *mut (), Ordering::Relaxed);
        s.pending.0.store(n - 1, Ordering::Relaxed);
        let generation = s.generation.0.fetch_add(1, Ordering::AcqRel) + 1;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mut result = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        // Take over every index whose worker has not started yet.
        for i in 1..n {
            if s.claimed[i].0.compare_exchange(generation - 1, generation, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                let r = catch_unwind(AssertUnwindSafe(|| f(i, n)));
                if result.is_ok() {
                    result = r;
                }
                s.pending.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let mut spins = 0u32;
        while s.pending.0.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 256 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("a kernel thread panicked");
        }
    }
}

/// Waits for a generation newer than `seen`; `None` on shutdown.
fn wait_for_work(s: &Shared, seen: u64) -> Option<u64> {
    let mut since: Option<Instant> = None;
    let mut spins = 0u32;
    loop {
        let g = s.generation.0.load(Ordering::Acquire);
        if g != seen {
            return Some(g);
        }
        if s.shutdown.load(Ordering::Acquire) {
            return None;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        let t0 = *since.get_or_insert_with(Instant::now);
        let waited = t0.elapsed();
        if waited < Duration::from_micros(SPIN_US) {
            std::hint::spin_loop();
        } else if waited < Duration::from_micros(PARK_AFTER_US) {
            std::thread::yield_now();
        } else {
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-check under the lock: `run` notifies while holding it, so no wakeup is lost.
            if s.generation.0.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                drop(s.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
            } else {
                drop(guard);
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            since = None;
        }
    }
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0u64;
    while let Some(generation) = wait_for_work(s, seen) {
        seen = generation;
        // Losing this race means the caller already ran (or is running) our index.
        if s.claimed[index].0.compare_exchange(generation - 1, generation, Ordering::AcqRel, Ordering::Relaxed).is_err()
        {
            continue;
        }
        // SAFETY: `run` keeps the job (and the reference to it) alive until `pending`
        // reaches zero, which happens only after this call returns.
        let job: &Job = unsafe { *(s.job.0.load(Ordering::Acquire) as *const &Job) };
        if catch_unwind(AssertUnwindSafe(|| job(index, s.n_threads))).is_err() {
            s.panicked.store(true, Ordering::Release);
        }
        s.pending.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Passes with fewer rows than this run their per-row work (norms, gates, the conv) on the
/// calling thread: for a decode step's handful of rows, waking the others costs more than it
/// saves.
pub const SPLIT_MIN_ROWS: usize = 4;

impl ThreadPool {
    /// Calls `f(part, rows)` on disjoint parts of `x`, rows of `row_len` values split across
    /// the pool (`rows` the part's row range, aligned to `align` rows), or once with all of `x`
    /// when it has fewer than `min_rows` rows. Row-wise work gets the same bits either way.
    pub fn split_rows<F: Fn(&mut [f32], std::ops::Range<usize>) + Sync>(
        &self,
        x: &mut [f32],
        row_len: usize,
        align: usize,
        min_rows: usize,
        f: F,
    ) {
        let rows = x.len() / row_len;
        if rows < min_rows || self.n_threads() == 1 {
            return f(x, 0..rows);
        }
        let ptr = RowsPtr(x.as_mut_ptr());
        self.run(|i, n| {
            let base = ptr; // the whole Sync wrapper, not its raw pointer field
            let r = split_range(rows, n, i, align);
            // SAFETY: each thread gets a disjoint range of rows of `x`, which outlives `run`.
            f(unsafe { std::slice::from_raw_parts_mut(base.0.add(r.start * row_len), r.len() * row_len) }, r)
        });
    }
}

#[derive(Clone, Copy)]
struct RowsPtr(*mut f32);
// SAFETY: `split_rows` hands each thread a disjoint range.
unsafe impl Send for RowsPtr {}
unsafe impl Sync for RowsPtr {}

/// Splits `0..n` into `parts` contiguous ranges, each a multiple of `align` except the last.
pub fn split_range(n: usize, parts: usize, index: usize, align: usize) -> std::ops::Range<usize> {
    let units = n.div_ceil(align);
    let per = units / parts;
    let extra = units % parts;
    let start = index * per + index.min(extra);
    let len = per + usize::from(index < extra);
    (start * align).min(n)..((start + len) * align).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn run_calls_every_index_exactly_once_across_many_dispatches() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..2000 {
                pool.run(|i, nt| {
                    assert_eq!(nt, n);
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 2000));
        }
    }

    #[test]
    fn run_wakes_parked_workers() {
        let pool = ThreadPool::new(3);
        let hits = AtomicU32::new(0);
        std::thread::sleep(std::time::Duration::from_millis(300));
        pool.run(|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 3);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn idle_workers_park_instead_of_spinning() {
        use std::os::unix::thread::JoinHandleExt;
        let pool = ThreadPool::new(2);
        pool.run(|_, _| {});
        let cpu_ns = || {
            let mut id: libc::clockid_t = 0;
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: the worker thread is alive (the pool is) and the out-pointers are valid.
            unsafe {
                assert_eq!(libc::pthread_getcpuclockid(pool.workers[0].as_pthread_t(), &mut id), 0);
                libc::clock_gettime(id, &mut ts);
            }
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        std::thread::sleep(Duration::from_millis(50));
        let t0 = cpu_ns();
        std::thread::sleep(Duration::from_millis(300));
        let used = cpu_ns() - t0;
        assert!(used < 5_000_000, "idle worker used {used} ns of CPU in 300 ms");
    }

    #[test]
    fn worker_panic_is_reraised_on_the_caller_and_pool_stays_usable() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(|i, _| assert!(i != 1, "boom"))));
        assert!(r.is_err());
        let hits = AtomicU32::new(0);
        pool.run(|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn split_range_covers_everything_once_with_alignment() {
        for n in [0, 1, 15, 16, 17, 100, 576] {
            for parts in 1..5 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split_range(n, parts, i, 16);
                    assert_eq!(r.start, next.min(n));
                    assert!(r.start.is_multiple_of(16) || r.start == n);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
