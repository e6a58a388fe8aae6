//! Scale simulation: the controller core over the in-memory fakes with a
//! fully converged fleet of `rows` sandboxes, to measure what a resync at
//! start (every row planned from the relist's lists, the unconverged ones
//! reconciled) costs in time and memory whatever Docker and Postgres cost.
//! Built with the `simulation` feature; `benches/fleet_sim.rs` runs it.

use super::{FakeRuntime, FakeStore, RuntimeOp, FAKE_ENGINES};
use crate::config::ControllerConfig;
use crate::controller::Controller;
use crate::domain::clock::SystemClock;
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::sandbox::DesiredSandbox;
use crate::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one simulated resync measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimReport {
    /// Desired rows (each with one ready status row and one running,
    /// matching container).
    pub rows: usize,
    /// Seconds from the controller's start (initial lists, then a relist
    /// that plans every row from them) until every row was found converged
    /// by that relist or reconciled.
    pub resync_seconds: f64,
    /// Rows the relist found converged in its lists (not reconciled).
    pub converged: u64,
    /// Rows reconciled during the resync.
    pub reconciled: u64,
    /// Seconds it took to provision the fleet through the controller
    /// before the measured resync (not part of the target).
    pub setup_seconds: f64,
    /// Containers created during the resync (0: every reconcile a no-op).
    pub creates: u64,
    /// Docker lists of the whole deployment during the resync.
    pub full_lists: u64,
    /// Resident memory after the run (VmRSS), bytes.
    pub rss_bytes: u64,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub hwm_bytes: u64,
    /// Resident memory once the fleet was provisioned and the first
    /// controller stopped (the fakes' fleet and the allocator's leftovers),
    /// before the measured resync, bytes.
    pub rss_before_resync_bytes: u64,
    /// Live heap bytes before the measured resync (the fakes' fleet), if
    /// the caller counted the heap.
    pub heap_before_resync_bytes: Option<u64>,
    /// The most live heap bytes at any moment of the resync, if counted.
    /// Less `heap_before_resync_bytes`: what the controller held for the
    /// resync (its lists, plans and queue), whatever the fakes hold.
    pub heap_peak_resync_bytes: Option<u64>,
}

/// The live heap of this process, from a counting global allocator that
/// the caller installed (the bench binary does; a library cannot).
pub trait HeapMeter: Sync {
    /// Bytes allocated and not yet freed.
    fn live(&self) -> u64;
    /// The most bytes live at once since the last [`HeapMeter::reset_peak`].
    fn peak(&self) -> u64;
    /// Starts a new peak at the current live bytes.
    fn reset_peak(&self);
}

/// Why a simulation did not finish.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The fleet did not converge, or the resync did not finish, in time.
    #[error("{0} did not finish within {1:?}; lower the row count or look for a stuck reconcile")]
    TimedOut(&'static str, Duration),
}

/// How long either phase may take before the run is abandoned.
const PHASE_LIMIT: Duration = Duration::from_secs(1800);

/// Provisions `rows` sandboxes through a first controller, stops it,
/// then starts a second one over the same fakes as production starts
/// (initial lists, watches, relist) and measures its full resync.
pub async fn run(
    rows: usize,
    concurrency: usize,
    heap: Option<&dyn HeapMeter>,
) -> Result<SimReport, SimError> {
    let runtime = Arc::new(FakeRuntime::default());
    let store = Arc::new(FakeStore::default());
    for i in 0..rows {
        store.put_desired(row(&format!("sim{i:06}")));
    }
    let mut config = ControllerConfig::new(Deployment::parse("sim").expect("a valid deployment"));
    config.concurrency = concurrency;
    config.relist_interval = Duration::from_secs(3600);

    let started = Instant::now();
    let metrics = Arc::new(Metrics::new());
    let setup = Controller::with_engines(
        runtime.clone(),
        store.clone(),
        FAKE_ENGINES,
        config.clone(),
        Arc::new(SystemClock),
        metrics.clone(),
    );
    let ready = "sandboxd_sandboxes{phase=\"ready\"}";
    run_until(setup, "provisioning the fleet", || {
        gauge(&metrics, ready) >= rows as f64
    })
    .await?;
    let setup_seconds = started.elapsed().as_secs_f64();
    // The peak from here on is the resync's (Linux resets VmHWM to VmRSS).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (rss_before_resync_bytes, _) = memory();
    let heap_before_resync_bytes = heap.map(|h| {
        h.reset_peak();
        h.live()
    });

    let creates = runtime.faults.calls(RuntimeOp::Create);
    let full_lists = runtime.full_lists();
    let metrics = Arc::new(Metrics::new());
    let resync = Controller::with_engines(
        runtime.clone(),
        store.clone(),
        FAKE_ENGINES,
        config,
        Arc::new(SystemClock),
        metrics.clone(),
    );
    let reconciled = "workqueue_work_duration_seconds_count{name=\"sandbox\"}";
    let converged = "sandboxd_relist_converged_sandboxes";
    let resync_seconds = run_until(resync, "the resync", || {
        gauge(&metrics, converged) + gauge(&metrics, reconciled) >= rows as f64
    })
    .await?
    .as_secs_f64();
    let (rss_bytes, hwm_bytes) = memory();
    let heap_peak_resync_bytes = heap.map(|h| h.peak());
    Ok(SimReport {
        rows,
        resync_seconds,
        converged: gauge(&metrics, converged) as u64,
        reconciled: gauge(&metrics, reconciled) as u64,
        setup_seconds,
        creates: runtime.faults.calls(RuntimeOp::Create) - creates,
        full_lists: runtime.full_lists() - full_lists,
        rss_bytes,
        hwm_bytes,
        rss_before_resync_bytes,
        heap_before_resync_bytes,
        heap_peak_resync_bytes,
    })
}

/// Runs `controller` until `done` holds (polled every 5 ms: rendering
/// the metrics takes CPU from what is measured), then
/// shuts it down and waits for it to give its lease up. Returns how long
/// `done` took to hold, from the controller's start.
async fn run_until(
    controller: Controller,
    what: &'static str,
    done: impl Fn() -> bool,
) -> Result<Duration, SimError> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let running = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    let waited = tokio::time::timeout(PHASE_LIMIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        started.elapsed()
    })
    .await;
    let _ = stop.send(());
    let _ = running.await;
    waited.map_err(|_| SimError::TimedOut(what, PHASE_LIMIT))
}

/// The value of the sample whose line starts with `line_start`, or 0.
fn gauge(metrics: &Metrics, line_start: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// VmRSS and VmHWM of this process in bytes (0 where /proc is absent).
pub fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn row(name: &str) -> DesiredSandbox {
    let id = SandboxId::parse(name).expect("a valid id");
    super::fake_row(id, BTreeMap::new(), chrono::Utc::now())
}
