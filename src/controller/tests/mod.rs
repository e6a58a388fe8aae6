//! `reconcile` and the controller against the in-memory fakes: Docker and
//! Postgres failing, hanging and panicking on demand. Each ends in a retry
//! or a `failed` status with a reason, never in a panic escaping, and the
//! queue keeps serving other keys.
//!
//! This module is the harness every test here shares (the fakes wired into
//! a controller, rows, waits in virtual time); each child module holds the
//! tests of one concern.

// The unit tests drive a reconcile without its deadline, on paused time.
use super::reconcile::{reconcile_unbounded as reconcile, Next, ReconcileError};
use super::*;
use crate::domain::clock::ManualClock;
use crate::domain::id::{ContainerId, Deployment, EngineName};
use crate::domain::sandbox::{DesiredSandbox, Phase};
use crate::ports::runtime::{Containers as _, Networks as _, Volumes as _};
use crate::testing::{
    FakeEngine, FakeRuntime, FakeStore, Fault, RuntimeOp, StoreOp, FAKE_ENGINES,
    TEMPLATED_FAKE_ENGINES,
};
use chrono::{DateTime, TimeZone, Utc};
use std::collections::{BTreeMap, BTreeSet};

mod admission;
mod breaker;
mod checkpoint;
mod controller;
mod deletion_safety;
mod identity;
mod isolation;
mod leader;
mod name_release;
mod owners_volumes_images;
mod pause;
mod pool;
mod reconcile;
mod relist_cost;
mod rotation;
mod start;

const ENGINE: EngineName = FakeEngine::NAME;

/// When the fake runtime says its containers were created.
fn created() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap()
}

fn id(s: &str) -> SandboxId {
    SandboxId::parse(s).unwrap()
}

fn row(name: &str) -> DesiredSandbox {
    DesiredSandbox {
        id: id(name),
        owner: "test".into(),
        services: vec![ENGINE],
        unknown_services: Vec::new(),
        attach: Vec::new(),
        invalid: None,
        features: BTreeMap::new(),
        expires_at: None,
        generation: 0,
        incarnation: None,
        updated_at: created(),
        created_at: created(),
        last_used_at: created(),
        idle_timeout: None,
        persistent: false,
        idle_action: Default::default(),
        owner_container: None,
        isolation: None,
        seeds: Default::default(),
        fork_of: None,
    }
}

/// The lease holder of [`Harness::context`].
const CONTEXT_HOLDER: &str = "reconcile-test";

struct Harness {
    runtime: Arc<FakeRuntime>,
    store: Arc<FakeStore>,
    clock: Arc<ManualClock>,
    metrics: Arc<Metrics>,
    config: ControllerConfig,
    /// The engines the controller knows: the fake one, without templates
    /// unless [`Harness::templated`].
    engines: Registry,
}

impl Harness {
    fn new() -> Self {
        let mut config = ControllerConfig::new(Deployment::parse("test").unwrap());
        config.grace = Duration::from_secs(180);
        config.concurrency = 2;
        Self {
            runtime: Arc::new(FakeRuntime::default()),
            store: Arc::new(FakeStore::default()),
            clock: Arc::new(ManualClock::new(created() + chrono::Duration::seconds(10))),
            metrics: Arc::new(Metrics::new()),
            config,
            engines: FAKE_ENGINES,
        }
    }

    /// A harness whose fake engine starts from a template, as Postgres.
    fn templated() -> Self {
        Self {
            engines: TEMPLATED_FAKE_ENGINES,
            ..Self::new()
        }
    }

    fn controller(&self) -> Controller {
        Controller::with_engines(
            self.runtime.clone(),
            self.store.clone(),
            self.engines,
            self.config.clone(),
            self.clock.clone(),
            self.metrics.clone(),
        )
    }

    /// A context that leads (for calling `reconcile` directly): it holds
    /// the store's lease for a day unless [`Harness::step_down`] ends it.
    fn context(&self) -> Arc<Context> {
        let ctx = self.controller().ctx;
        let day = Duration::from_secs(86_400);
        let term = self.store.steal_lease(CONTEXT_HOLDER, day);
        ctx.env.fence.grant(term, tokio::time::Instant::now() + day);
        ctx
    }

    /// What a relist does for the reaping breaker: one look at the fleet
    /// (a hundred sandboxes, none missing), at the injected clock's now.
    fn look(&self, ctx: &Context) {
        ctx.reaps.breaker.look(
            &ctx.env.config.breaker,
            &Default::default(),
            100,
            &Default::default(),
            self.clock.now(),
        );
    }

    /// Ends the lease [`Harness::context`] took, so that a controller can lead.
    async fn step_down(&self) {
        let (holder, term) = self.store.lease_of().expect("a lease");
        assert_eq!(holder, CONTEXT_HOLDER);
        self.store.release_lease(&holder, term).await.unwrap();
    }

    /// The containers of `sandbox` as (id, instance label).
    /// Names of the deployment's networks, sorted.
    async fn networks(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .runtime
            .networks(&self.config.deployment)
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        names.sort();
        names
    }

    fn containers(&self, sandbox: &SandboxId) -> Vec<(ContainerId, String)> {
        self.runtime
            .containers_of(sandbox)
            .into_iter()
            .map(|(id, c)| (id, c.labels.instance))
            .collect()
    }

    /// The one container of `sandbox` and the status entry published for
    /// it, asserting they belong together.
    fn published(&self, sandbox: &SandboxId) -> (ContainerId, crate::domain::ServiceStatus) {
        let containers = self.containers(sandbox);
        assert_eq!(containers.len(), 1, "one container: {containers:?}");
        let status = self.store.status_of(sandbox).expect("a status row");
        assert_eq!(status.phase, Phase::Ready, "{}", status.message);
        let service = status.services[ENGINE.as_str()].clone();
        assert_eq!(service.instance, containers[0].1);
        (containers[0].0.clone(), *service)
    }

    /// A refused change: `sandbox` is `failed`, its container `before` is
    /// kept and its credentials stay published.
    fn assert_failed_and_kept(&self, sandbox: &SandboxId, before: &ContainerId) {
        let status = self.store.status_of(sandbox).expect("a status row");
        assert_eq!(status.phase, Phase::Failed);
        assert_eq!(
            &self.containers(sandbox)[0].0,
            before,
            "the container was kept"
        );
        assert!(
            !status.services.is_empty(),
            "its credentials stay published"
        );
    }

    fn metric(&self, line_start: &str) -> f64 {
        let text = self.metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {line_start} in\n{text}"))
    }
}

// Running whole controllers, for the tests of what happens around reconcile.

/// Runs the controller until `stop` is dropped or sent.
fn start(
    controller: Controller,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        controller
            .run(async {
                let _ = rx.await;
            })
            .await
            .expect("controller runs");
    });
    (tx, task)
}

/// Waits (in virtual time) until `f` holds, up to a minute.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within a minute: {what}");
}

/// Puts a row for each of `names` and waits (in virtual time) until every
/// one is ready.
async fn all_ready(h: &Harness, names: &[String]) {
    for n in names {
        h.store.put_desired(row(n));
    }
    until("all ready", || {
        names
            .iter()
            .all(|n| h.store.phase_of(&id(n)) == Some(Phase::Ready))
    })
    .await;
}

/// `n` sandbox names starting with `prefix`.
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// A warm pool of one container of the fake engine, no features, no seed.
fn with_pool(h: &mut Harness) {
    h.config.warm_pool = BTreeMap::from([(
        crate::domain::pool::PoolKey {
            engine: ENGINE,
            features: Default::default(),
            seed: None,
        },
        1,
    )]);
}

/// The value of the metric line that starts with `series` (0 if absent).
fn metric(h: &Harness, series: &str) -> f64 {
    h.metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}
