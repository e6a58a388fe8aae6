//! A keyed work queue that drives reconcile handlers, in the spirit of
//! kube-runtime's scheduler and runner, with per-key backoff, metrics hooks
//! and panic isolation.
//!
//! Guarantees:
//! - **Dedup**: a key is waiting at most once; adding a waiting key again only
//!   ever moves it earlier.
//! - **One at a time per key**: a key's handler never runs twice at once. An
//!   add while it runs marks it dirty; it runs once more right after the current
//!   run (unless that run failed: then the backoff retry covers the add).
//! - **Global concurrency**: at most [`QueueConfig::concurrency`] handlers run
//!   at once; ready keys start in the order they became ready.
//! - **Backoff**: [`Failed`] (or a panic) retries the key after
//!   `backoff_base * 2^(failures - 1)`, capped at `backoff_cap`; any success
//!   resets it. An `add` does not cut a backoff short (a failing key hammered
//!   by events must not hot-loop), but it does cut a periodic
//!   [`Next::After`] short (an event should not wait for the next resync).
//!   [`WorkQueue::add_fresh`] is for a new request: it forgets the key's
//!   failures and runs it at once, backoff or not (a client that asks again
//!   after a failure must not wait for a retry scheduled for the old ask).
//! - **Panic isolation**: each handler runs in its own task; a panic is logged,
//!   reported to [`QueueObserver::panicked`] and treated as a failure.
//! - **Shutdown**: once the shutdown future resolves no handler starts; `run`
//!   waits up to `shutdown_grace` for in-flight ones, then aborts the rest.

use crate::fleet_hash::HashMap;
use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinError};
use tokio::time::Instant;

/// Delays are clamped to this (about 34 years) so `Instant` arithmetic never overflows.
const MAX_DELAY: Duration = Duration::from_secs(1 << 30);

/// When a key whose handler succeeded is run again. A reconcile returns
/// it too: it is the one answer from the controller to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Not until something adds it (or the periodic relist does).
    Idle,
    /// After this delay, unless it is due earlier anyway (a periodic
    /// resync, or a wait such as a reap's grace window).
    After(Duration),
}

/// A handler run that failed: its key is retried with backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed;

/// What a handler reports for one key.
pub type Outcome = Result<Next, Failed>;

/// How a handler run ended, as reported to [`QueueObserver::finished`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedAs {
    /// `Ok(Next::Idle)`.
    Success,
    /// `Ok(Next::After(_))`.
    Requeue,
    /// `Err(Failed)`, or the handler was aborted at shutdown.
    Error,
    /// The handler panicked.
    Panic,
}

/// Tuning for a [`WorkQueue`].
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Global limit of handlers running at once; 0 is treated as 1. Default 4.
    pub concurrency: usize,
    /// First retry delay after a failure. Default 500 ms.
    pub backoff_base: Duration,
    /// Largest retry delay. Default 5 minutes.
    pub backoff_cap: Duration,
    /// How long `run` waits for in-flight handlers after shutdown. Default 30 s.
    pub shutdown_grace: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Hooks for metrics; every method has an empty default.
///
/// Methods are called while the queue's internal lock is held, so they must be
/// quick and must not call back into the [`WorkQueue`].
pub trait QueueObserver: Send + Sync + 'static {
    /// An `add`/`add_after` call created new work: the key was neither waiting
    /// nor already marked dirty while running (like client-go's
    /// `workqueue_adds_total`, duplicates are not counted; internal requeues
    /// and retries are not counted either).
    fn added(&self) {}
    /// The number of ready keys (due, waiting for a free slot) changed.
    fn depth(&self, _depth: usize) {}
    /// A handler started; `waited` is the time since its key became due.
    fn started(&self, _waited: Duration) {}
    /// A handler finished after `took`.
    fn finished(&self, _took: Duration, _outcome: &FinishedAs) {}
    /// A key was scheduled with backoff after a failure or panic.
    fn retried(&self) {}
    /// The number of handlers running now changed.
    fn active(&self, _running: usize) {}
    /// A handler panicked.
    fn panicked(&self) {}
}

/// A key that is waiting to run (not running).
struct Waiting {
    due: Instant,
    /// Scheduled by a failure: `add`/`add_after` do not move it.
    backoff: bool,
    /// Due and queued in `State::ready`.
    ready: bool,
}

struct State<K> {
    waiting: HashMap<K, Waiting>,
    /// Keys of `waiting` that are due, in the order they became due.
    ready: VecDeque<K>,
    /// Running keys: when they started, the earliest time asked for by an
    /// add during the run (the key is "dirty"), and whether a fresh request
    /// came during the run (then a failure of the run is not backed off).
    running: HashMap<K, (Instant, Option<Instant>, bool)>,
    failures: HashMap<K, u32>,
    /// How many keys of `waiting` are not due yet: while none is, nothing
    /// scans `waiting` (a relist of 100 000 keys stays linear).
    delayed: usize,
    /// Last (depth, active) reported to the observer.
    reported: (usize, usize),
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Schedule a key that is not running; returns whether it was not waiting.
    fn schedule(&mut self, key: K, due: Instant, backoff: bool, now: Instant) -> bool {
        let (w, new) = match self.waiting.entry(key.clone()) {
            Entry::Occupied(o) => {
                let w = o.into_mut();
                if !w.ready {
                    self.delayed -= 1;
                }
                if !w.backoff && due < w.due {
                    w.due = due;
                }
                (w, false)
            }
            Entry::Vacant(v) => (
                v.insert(Waiting {
                    due,
                    backoff,
                    ready: false,
                }),
                true,
            ),
        };
        if !w.ready && w.due <= now {
            w.ready = true;
            self.ready.push_back(key);
        }
        if !w.ready {
            self.delayed += 1;
        }
        new
    }

    /// Move keys whose time has come into `ready`, earliest first.
    fn promote(&mut self, now: Instant) {
        if self.delayed == 0 {
            return;
        }
        let mut due: Vec<(Instant, K)> = (self.waiting.iter())
            .filter(|(_, w)| !w.ready && w.due <= now)
            .map(|(k, w)| (w.due, k.clone()))
            .collect();
        due.sort_by_key(|(at, _)| *at);
        for (_, key) in due {
            if let Some(w) = self.waiting.get_mut(&key) {
                w.ready = true;
                self.delayed -= 1;
                self.ready.push_back(key);
            }
        }
    }

    fn report(&mut self, observer: &dyn QueueObserver) {
        let now = (self.ready.len(), self.running.len());
        if now.0 != self.reported.0 {
            observer.depth(now.0);
        }
        if now.1 != self.reported.1 {
            observer.active(now.1);
        }
        self.reported = now;
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    config: QueueConfig,
    observer: Arc<dyn QueueObserver>,
}

/// A cheap, cloneable handle to a keyed work queue (see the module docs).
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Retry delay after `failures` consecutive failures.
fn backoff(config: &QueueConfig, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(31);
    (config.backoff_base.checked_mul(factor))
        .unwrap_or(config.backoff_cap)
        .min(config.backoff_cap)
}

fn panic_message(err: JoinError) -> String {
    let payload = err.into_panic();
    (payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Debug + Send + Sync + 'static,
{
    /// Create an empty queue; nothing runs until [`WorkQueue::run`] is called.
    pub fn new(config: QueueConfig, observer: Arc<dyn QueueObserver>) -> Self {
        let state = State {
            waiting: HashMap::default(),
            ready: VecDeque::new(),
            running: HashMap::default(),
            failures: HashMap::default(),
            delayed: 0,
            reported: (0, 0),
        };
        let inner = Inner {
            state: Mutex::new(state),
            notify: Notify::new(),
            config,
            observer,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Ask for `key` to be handled as soon as possible. Duplicate adds of a
    /// waiting key collapse into one; a key waiting in backoff keeps its
    /// backoff; a running key runs once more right after its current run (or
    /// after its backoff, if that run fails).
    pub fn add(&self, key: K) {
        self.add_at(key, Duration::ZERO);
    }

    /// Ask for `key` to be handled now because something new was asked of it
    /// (a new generation of its desired row): its failures are forgotten and
    /// a backoff is cut short. A running key runs once more right after its
    /// current run, even if that run fails.
    pub fn add_fresh(&self, key: K) {
        let now = Instant::now();
        let mut st = self.lock();
        st.failures.remove(&key);
        let new = if let Some((_, dirty, fresh)) = st.running.get_mut(&key) {
            let new = dirty.is_none();
            *dirty = Some(now);
            *fresh = true;
            new
        } else {
            if let Some(w) = st.waiting.get_mut(&key) {
                w.backoff = false;
            }
            st.schedule(key, now, false, now)
        };
        if new {
            self.inner.observer.added();
        }
        st.report(&*self.inner.observer);
        drop(st);
        self.inner.notify.notify_one();
    }

    /// Ask for `key` to be handled after `delay`. If the key is already
    /// waiting, the earlier of the two times wins, except that a key waiting
    /// in backoff is never moved.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.add_at(key, delay);
    }

    fn add_at(&self, key: K, delay: Duration) {
        let now = Instant::now();
        let due = now + delay.min(MAX_DELAY);
        let mut st = self.lock();
        let new = if let Some((_, dirty, _)) = st.running.get_mut(&key) {
            let new = dirty.is_none();
            *dirty = Some(dirty.map_or(due, |d| d.min(due)));
            new
        } else {
            st.schedule(key, due, false, now)
        };
        if new {
            self.inner.observer.added();
        }
        st.report(&*self.inner.observer);
        drop(st);
        self.inner.notify.notify_one();
    }

    /// Number of keys waiting to run (scheduled or ready, not running). A
    /// running key that was added again is not counted until it finishes.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Number of keys due now and waiting for a worker (not those
    /// scheduled for later): background work that must not starve
    /// requests waits while this is not zero.
    pub fn due(&self) -> usize {
        self.lock().ready.len()
    }

    /// Whether no key is waiting to run.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long the longest-running handler has been running, and the sum
    /// over all running handlers (for `workqueue_longest_running_processor_seconds`
    /// and `workqueue_unfinished_work_seconds`).
    pub fn running_times(&self) -> (Duration, Duration) {
        let now = Instant::now();
        let st = self.lock();
        let times = st
            .running
            .values()
            .map(|r| now.saturating_duration_since(r.0));
        times.fold(Default::default(), |(max, sum), t| (t.max(max), sum + t))
    }

    /// Drive the queue until `shutdown` resolves: then stop starting new
    /// handlers, wait up to `shutdown_grace` for in-flight ones, abort any
    /// still running, and return how many that was (0 = clean). Call it from
    /// one task at a time; keys added before or during `run` are kept.
    pub async fn run<F, Fut>(&self, handler: F, shutdown: impl Future<Output = ()>) -> usize
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut in_flight: Vec<AbortHandle> = Vec::new();
        loop {
            if futures::poll!(shutdown.as_mut()).is_ready() {
                break;
            }
            let (batch, next) = self.take_ready();
            in_flight.retain(|h| !h.is_finished());
            for key in batch {
                in_flight.push(self.spawn(Arc::clone(&handler), key));
            }
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = shutdown.as_mut() => break,
                () = self.inner.notify.notified() => {}
                () = sleep => {}
            }
        }
        self.drain(&in_flight).await
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Mark ready keys as running, up to the concurrency limit; also return
    /// the next time a waiting key becomes due.
    fn take_ready(&self) -> (Vec<K>, Option<Instant>) {
        let now = Instant::now();
        let observer = &*self.inner.observer;
        let mut st = self.lock();
        st.promote(now);
        let mut batch = Vec::new();
        while st.running.len() < self.inner.config.concurrency.max(1) {
            let Some(key) = st.ready.pop_front() else {
                break;
            };
            if let Some(w) = st.waiting.remove(&key) {
                if !w.ready {
                    st.delayed -= 1;
                }
                observer.started(now.saturating_duration_since(w.due));
                st.running.insert(key.clone(), (now, None, false));
                batch.push(key);
            }
        }
        let next = if st.delayed == 0 {
            None
        } else {
            st.waiting
                .values()
                .filter(|w| !w.ready)
                .map(|w| w.due)
                .min()
        };
        st.report(observer);
        (batch, next)
    }

    fn spawn<F, Fut>(&self, handler: Arc<F>, key: K) -> AbortHandle
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let arg = key.clone();
        // The handler is called inside the task so a panic while building the
        // future is isolated too.
        let task = tokio::spawn(async move { (*handler)(arg).await });
        let abort = task.abort_handle();
        let queue = self.clone();
        tokio::spawn(async move {
            let result = task.await;
            queue.finish(key, result);
        });
        abort
    }

    fn finish(&self, key: K, result: Result<Outcome, JoinError>) {
        let now = Instant::now();
        let observer = &*self.inner.observer;
        let mut st = self.lock();
        let (started, dirty, fresh) = st.running.remove(&key).unwrap_or((now, None, false));
        let (finished, failed) = match result {
            Ok(Ok(next)) => {
                st.failures.remove(&key);
                let requeue = match next {
                    Next::Idle => None,
                    Next::After(d) => Some(now + d.min(MAX_DELAY)),
                };
                let due = requeue.into_iter().chain(dirty.map(|d| d.max(now))).min();
                if let Some(due) = due {
                    st.schedule(key.clone(), due, false, now);
                }
                let how = match requeue {
                    Some(_) => FinishedAs::Requeue,
                    None => FinishedAs::Success,
                };
                (how, false)
            }
            Ok(Err(Failed)) => (FinishedAs::Error, true),
            Err(err) if err.is_panic() => {
                observer.panicked();
                tracing::error!(key = ?key, panic = %panic_message(err), "handler panicked");
                (FinishedAs::Panic, true)
            }
            Err(_) => {
                tracing::warn!(key = ?key, "handler aborted; key will run again");
                st.schedule(key.clone(), now, false, now);
                (FinishedAs::Error, false)
            }
        };
        if failed && fresh {
            // Asked again during the failed run: try the new ask at once.
            st.schedule(key.clone(), now, false, now);
        } else if failed {
            let count = st.failures.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            let failures = *count;
            let delay = backoff(&self.inner.config, failures);
            st.schedule(key.clone(), now + delay, true, now);
            observer.retried();
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            tracing::debug!(key = ?key, failures, delay_ms, "scheduled retry");
        }
        observer.finished(now.saturating_duration_since(started), &finished);
        st.report(observer);
        drop(st);
        self.inner.notify.notify_one();
    }

    /// Wait up to the grace period for running handlers; abort the rest.
    async fn drain(&self, in_flight: &[AbortHandle]) -> usize {
        let deadline = Instant::now() + self.inner.config.shutdown_grace.min(MAX_DELAY);
        loop {
            let notified = self.inner.notify.notified();
            if self.lock().running.is_empty() {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let left = self.lock().running.len();
                if left > 0 {
                    tracing::warn!(
                        still_running = left,
                        "shutdown grace expired; aborting handlers"
                    );
                    in_flight.iter().for_each(AbortHandle::abort);
                }
                return left;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A [`QueueObserver`] that records nothing.
    struct NoopObserver;

    impl QueueObserver for NoopObserver {}
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use tokio::{sync::oneshot, task::JoinHandle, time::sleep};

    type Q = WorkQueue<&'static str>;
    const DONE: Outcome = Ok(Next::Idle);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn queue(concurrency: usize, base: u64, cap: u64, observer: Arc<dyn QueueObserver>) -> Q {
        let (backoff_base, backoff_cap) = (ms(base), ms(cap));
        let config = QueueConfig {
            concurrency,
            backoff_base,
            backoff_cap,
            ..Default::default()
        };
        Q::new(config, observer)
    }

    fn resync(every: u64) -> Outcome {
        Ok(Next::After(ms(every)))
    }

    /// What handlers did: start times (ms since test start), concurrency.
    #[derive(Default)]
    struct Rec {
        runs: Mutex<Vec<(&'static str, u64)>>,
        running: Mutex<Vec<&'static str>>,
        max: AtomicUsize,
        overlap: AtomicBool,
    }

    impl Rec {
        fn times(&self, key: &str) -> Vec<u64> {
            let runs = self.runs.lock().unwrap();
            runs.iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, t)| *t)
                .collect()
        }
    }

    /// Run `q` with a handler whose n-th run of a key works for the given
    /// milliseconds and then returns the given outcome.
    fn start<S>(q: &Q, script: S) -> (Arc<Rec>, oneshot::Sender<()>, JoinHandle<usize>)
    where
        S: Fn(&'static str, usize) -> (u64, Outcome) + Send + Sync + 'static,
    {
        let (rec, t0) = (Arc::new(Rec::default()), Instant::now());
        let r = Arc::clone(&rec);
        let handler = move |key: &'static str| {
            let r = Arc::clone(&r);
            let n = {
                let mut runs = r.runs.lock().unwrap();
                runs.push((key, t0.elapsed().as_millis() as u64));
                runs.iter().filter(|(k, _)| *k == key).count() - 1
            };
            let (work, outcome) = script(key, n);
            async move {
                {
                    let mut running = r.running.lock().unwrap();
                    r.overlap.fetch_or(running.contains(&key), SeqCst);
                    running.push(key);
                    r.max.fetch_max(running.len(), SeqCst);
                }
                sleep(ms(work)).await;
                r.running.lock().unwrap().retain(|k| *k != key);
                outcome
            }
        };
        let (tx, rx) = oneshot::channel::<()>();
        let q = q.clone();
        let stop = async { rx.await.unwrap_or_default() };
        let task = tokio::spawn(async move { q.run(handler, stop).await });
        (rec, tx, task)
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Ev {
        Add,
        Depth(usize),
        Start(u64),
        Done(u64, FinishedAs),
        Retry,
        Active(usize),
        Panic,
    }

    #[derive(Default)]
    struct Events(Mutex<Vec<Ev>>);

    impl QueueObserver for Events {
        fn added(&self) {
            self.0.lock().unwrap().push(Ev::Add);
        }
        fn depth(&self, depth: usize) {
            self.0.lock().unwrap().push(Ev::Depth(depth));
        }
        fn started(&self, waited: Duration) {
            self.0
                .lock()
                .unwrap()
                .push(Ev::Start(waited.as_millis() as u64));
        }
        fn finished(&self, took: Duration, how: &FinishedAs) {
            self.0
                .lock()
                .unwrap()
                .push(Ev::Done(took.as_millis() as u64, *how));
        }
        fn retried(&self) {
            self.0.lock().unwrap().push(Ev::Retry);
        }
        fn active(&self, running: usize) {
            self.0.lock().unwrap().push(Ev::Active(running));
        }
        fn panicked(&self) {
            self.0.lock().unwrap().push(Ev::Panic);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn duplicate_adds_of_a_waiting_key_collapse_into_one_run() {
        let q = queue(1, 500, 1000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, _| (100, DONE));
        q.add("busy");
        (0..3).for_each(|_| q.add("a"));
        assert_eq!(q.len(), 2);
        sleep(ms(1000)).await;
        assert_eq!(rec.times("a"), vec![100]);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_running_runs_once_more_right_after_and_never_concurrently() {
        let q = queue(4, 500, 1000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, _| (100, DONE));
        q.add("a");
        sleep(ms(50)).await;
        (0..3).for_each(|_| q.add("a"));
        assert_eq!(q.len(), 0, "a running key is not counted as waiting");
        sleep(ms(1000)).await;
        assert_eq!(rec.times("a"), vec![0, 100]);
        assert!(!rec.overlap.load(SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_concurrency_handlers_run_at_once() {
        let q = queue(3, 500, 1000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, _| (10, DONE));
        let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"];
        keys.iter().for_each(|k| q.add(k));
        sleep(ms(1000)).await;
        assert_eq!(rec.max.load(SeqCst), 3);
        assert_eq!(rec.runs.lock().unwrap().len(), keys.len());
        assert_eq!(rec.times("k9"), vec![30], "in the order they became ready");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_up_to_the_cap_and_success_resets_them() {
        let q = queue(1, 500, 4000, Arc::new(NoopObserver));
        let fail_but = |ok: bool| if ok { DONE } else { Err(Failed) };
        let (rec, _tx, _task) = start(&q, move |_, n| (0, fail_but(n == 5 || n == 7)));
        q.add("a");
        sleep(ms(20_000)).await;
        // Delays 500, 1000, 2000, 4000, 4000 (capped), then success.
        assert_eq!(rec.times("a"), vec![0, 500, 1500, 3500, 7500, 11_500]);
        q.add("a");
        sleep(ms(5_000)).await;
        assert_eq!(rec.times("a")[6..], [20_000, 20_500], "first delay again");
    }

    #[tokio::test(start_paused = true)]
    async fn add_does_not_cut_a_backoff_short() {
        let q = queue(1, 1000, 60_000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, n| (0, if n == 0 { Err(Failed) } else { DONE }));
        q.add("a");
        sleep(ms(100)).await;
        q.add("a");
        q.add_after("a", ms(10));
        assert_eq!(q.len(), 1);
        sleep(ms(5_000)).await;
        assert_eq!(rec.times("a"), vec![0, 1000]);
    }

    #[tokio::test(start_paused = true)]
    async fn add_fresh_cuts_a_backoff_short_and_forgets_the_failures() {
        let q = queue(1, 1000, 60_000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, n| (0, if n < 4 { Err(Failed) } else { DONE }));
        q.add("a");
        // Failures at 0, 1000, 3000, 7000: the next retry would be at 15 000.
        sleep(ms(8_000)).await;
        q.add_fresh("a");
        sleep(ms(100)).await;
        assert_eq!(rec.times("a"), vec![0, 1000, 3000, 7000, 8000]);
        // Its failures were forgotten: a later failure starts at the first delay.
        assert!(!q.lock().failures.contains_key("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn add_fresh_during_a_failing_run_runs_the_key_again_at_once() {
        let q = queue(1, 10_000, 60_000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, n| (500, if n == 0 { Err(Failed) } else { DONE }));
        q.add("a");
        sleep(ms(100)).await;
        q.add_fresh("a");
        sleep(ms(2_000)).await;
        assert_eq!(rec.times("a"), vec![0, 500]);
    }

    #[tokio::test(start_paused = true)]
    async fn add_cuts_a_periodic_requeue_short() {
        let q = queue(1, 500, 1000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, move |_, _| (0, resync(60_000)));
        q.add("a");
        sleep(ms(5_000)).await;
        q.add("a");
        sleep(ms(65_000)).await;
        assert_eq!(rec.times("a"), vec![0, 5_000, 65_000]);
    }

    #[tokio::test(start_paused = true)]
    async fn next_after_runs_the_key_again_after_the_delay() {
        let q = queue(1, 500, 1000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, move |_, _| (0, resync(10_000)));
        q.add("a");
        sleep(ms(25_000)).await;
        assert_eq!(rec.times("a"), vec![0, 10_000, 20_000]);
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_the_earliest_scheduled_time() {
        let q = queue(1, 500, 1000, Arc::new(NoopObserver));
        let (rec, _tx, _task) = start(&q, |_, _| (0, DONE));
        q.add_after("a", ms(3_000));
        q.add_after("a", ms(9_000));
        q.add_after("b", ms(9_000));
        q.add_after("b", ms(2_000));
        assert_eq!(q.len(), 2);
        sleep(ms(10_000)).await;
        assert_eq!((rec.times("a"), rec.times("b")), (vec![3_000], vec![2_000]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_handler_is_reported_retried_with_backoff_and_other_keys_keep_running() {
        let events = Arc::new(Events::default());
        let q = queue(1, 500, 60_000, events.clone());
        let (rec, _tx, _task) = start(&q, |key, _| match key {
            "bad" => panic!("boom"),
            _ => (0, DONE),
        });
        q.add("bad");
        q.add("good");
        sleep(ms(2_000)).await;
        q.add("good");
        sleep(ms(100)).await;
        assert_eq!(rec.times("bad"), vec![0, 500, 1500]);
        assert_eq!(rec.times("good"), vec![0, 2_000]);
        let events = events.0.lock().unwrap();
        assert_eq!(events.iter().filter(|e| **e == Ev::Panic).count(), 3);
        assert_eq!(events.iter().filter(|e| **e == Ev::Retry).count(), 3);
        assert!(events.contains(&Ev::Done(0, FinishedAs::Panic)));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_in_flight_handlers_starts_no_new_ones_and_returns_zero() {
        let q = queue(1, 500, 1000, Arc::new(NoopObserver));
        let (rec, tx, task) = start(&q, |_, _| (2_000, DONE));
        let t0 = Instant::now();
        q.add("a");
        q.add("b");
        sleep(ms(1_000)).await;
        tx.send(()).unwrap();
        assert_eq!(task.await.unwrap(), 0);
        assert_eq!(t0.elapsed(), ms(2_000), "returned when a finished");
        assert_eq!(*rec.runs.lock().unwrap(), [("a", 0)]);
        assert_eq!(q.len(), 1, "b is still waiting");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_gives_up_after_the_grace_period_and_returns_the_count_still_running() {
        let q = queue(2, 500, 1000, Arc::new(NoopObserver));
        let (_rec, tx, task) = start(&q, |key, _| {
            (if key == "slow" { 3_600_000 } else { 10 }, DONE)
        });
        let t0 = Instant::now();
        q.add("slow");
        q.add("fast");
        sleep(ms(1_000)).await;
        tx.send(()).unwrap();
        assert_eq!(task.await.unwrap(), 1);
        assert_eq!(t0.elapsed(), ms(31_000));
        sleep(ms(1)).await;
        assert_eq!(q.running_times().0, Duration::ZERO, "slow was aborted");
    }

    #[tokio::test(start_paused = true)]
    async fn observer_sees_adds_depth_active_started_and_finished() {
        let events = Arc::new(Events::default());
        let q = queue(1, 500, 1000, events.clone());
        q.add("a");
        q.add("b");
        q.add("a");
        let (_rec, _tx, _task) = start(&q, |_, _| (100, DONE));
        sleep(ms(1_000)).await;
        use Ev::*;
        let ok = Done(100, FinishedAs::Success);
        let expected = [
            Add,
            Depth(1),
            Add,
            Depth(2),
            Start(0),
            Depth(1),
            Active(1),
            ok,
        ];
        let expected2 = [Active(0), Start(100), Depth(0), Active(1), ok, Active(0)];
        let events = events.0.lock().unwrap();
        assert_eq!(
            (&events[..8], &events[8..]),
            (&expected[..], &expected2[..])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn running_times_reports_the_longest_and_the_total() {
        let q = queue(2, 500, 1000, Arc::new(NoopObserver));
        let (_rec, _tx, _task) = start(&q, |_, _| (10_000, DONE));
        q.add("a");
        sleep(ms(1_000)).await;
        q.add("b");
        sleep(ms(2_000)).await;
        assert_eq!(q.running_times(), (ms(3_000), ms(5_000)));
    }

    #[test]
    fn the_run_future_is_send_and_the_handle_is_send_and_sync() {
        fn send<T: Send>(_: &T) {}
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Q>();
        let q = Q::new(QueueConfig::default(), Arc::new(NoopObserver));
        send(&q.run(|_| async { DONE }, async {}));
    }
}
