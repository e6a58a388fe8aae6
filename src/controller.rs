//! The controller: watches as hints, relists as the truth, and a work queue
//! that runs `reconcile(id)` one key at a time.

use crate::clock::Clock;
use crate::config::ControllerConfig;
use crate::heal_loop::HealLoops;
use crate::http::Probes;
use crate::id::SandboxId;
use crate::labels;
use crate::metrics::{Metrics, CONTROLLER};
use crate::model::{Phase, SandboxStatus};
use crate::queue::{Outcome, QueueConfig, WorkQueue};
use crate::reconcile::{self, Context, Next};
use crate::runtime::{self, ContainerState, ObservedContainer, RuntimeError};
use crate::store::{self, StoreError};
use crate::watch::{self, KnownContainers, Sink};
use async_trait::async_trait;
use bollard::Docker;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Failures that stop the controller from starting.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The state database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Docker failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Shared, cheap-to-clone readiness flag for `/readyz`.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Whether the initial lists of both sides are loaded.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }
}

/// A running controller's parts.
pub struct Controller {
    ctx: Arc<Context>,
    queue: WorkQueue<SandboxId>,
    readiness: Readiness,
    known: Arc<KnownContainers>,
    relist_now: Arc<Notify>,
}

/// Where watchers send their hints.
struct QueueSink {
    queue: WorkQueue<SandboxId>,
    relist_now: Arc<Notify>,
}

impl Sink for QueueSink {
    fn hint(&self, id: SandboxId) {
        self.queue.add(id);
    }
    fn hint_later(&self, id: SandboxId, delay: Duration) {
        // A separate timer, not `add_after`: a waiting key keeps its
        // earliest time, which would swallow this second look.
        let queue = self.queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(id);
        });
    }
    fn relist(&self) {
        self.relist_now.notify_one();
    }
}

impl Controller {
    /// Builds a controller; nothing runs until [`Controller::run`].
    pub fn new(
        pool: PgPool,
        docker: Docker,
        config: ControllerConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let queue_config = QueueConfig {
            concurrency: config.concurrency.max(1),
            shutdown_grace: config.shutdown_grace,
            ..QueueConfig::default()
        };
        metrics
            .max_concurrent
            .with_label_values(&[CONTROLLER])
            .set(queue_config.concurrency as i64);
        let queue = WorkQueue::new(queue_config, metrics.clone());
        Self {
            ctx: Arc::new(Context {
                pool,
                docker,
                config,
                clock,
                metrics,
                heal_loops: HealLoops::default(),
            }),
            queue,
            readiness: Readiness::default(),
            known: Arc::new(KnownContainers::default()),
            relist_now: Arc::new(Notify::new()),
        }
    }

    /// The readiness flag.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// What `/metrics` and `/readyz` ask of this controller.
    pub fn probes(&self) -> Arc<dyn Probes> {
        Arc::new(ControllerProbes {
            ctx: self.ctx.clone(),
            queue: self.queue.clone(),
            readiness: self.readiness.clone(),
        })
    }

    /// Runs until `shutdown` resolves; then stops taking new work, lets
    /// in-flight reconciles finish within the shutdown grace, and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ControllerError> {
        let ctx = self.ctx.clone();
        runtime::ensure_network(&ctx.docker, &ctx.config.network).await?;

        // Subscribe to both streams before the initial lists, so no change
        // falls in between.
        let sink: Arc<dyn Sink> = Arc::new(QueueSink {
            queue: self.queue.clone(),
            relist_now: self.relist_now.clone(),
        });
        let listener = watch::listen(&ctx.pool).await?;
        let docker_watch = tokio::spawn(watch::watch_docker(
            ctx.docker.clone(),
            format!("{}={}", labels::DEPLOYMENT, ctx.config.deployment),
            self.known.clone(),
            ctx.metrics.clone(),
            sink.clone(),
        ));
        let pg_watch = tokio::spawn(watch::watch_desired(
            listener,
            ctx.pool.clone(),
            ctx.metrics.clone(),
            sink,
        ));

        relist(&ctx, &self.queue, &self.known, false).await?;
        // Readiness gate: only now may anything be reaped or provisioned.
        self.readiness.set(true);
        tracing::info!(deployment = %ctx.config.deployment, "initial lists loaded; controller ready");

        let relister = tokio::spawn(relist_loop(
            ctx.clone(),
            self.queue.clone(),
            self.known.clone(),
            self.relist_now.clone(),
        ));

        let handler_ctx = ctx.clone();
        let handler = move |id: SandboxId| {
            let ctx = handler_ctx.clone();
            async move {
                match reconcile::reconcile(&ctx, &id).await {
                    Ok(Next::Idle) => Outcome::Done {
                        requeue_after: None,
                    },
                    Ok(Next::After(d)) => Outcome::Done {
                        requeue_after: Some(d),
                    },
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "reconcile failed; retrying with backoff");
                        Outcome::Failed
                    }
                }
            }
        };
        let abandoned = self.queue.run(handler, shutdown).await;
        self.readiness.set(false);
        docker_watch.abort();
        pg_watch.abort();
        relister.abort();
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                grace_ms = ctx.config.shutdown_grace.as_millis() as u64,
                "shutdown grace elapsed with reconciles still running"
            );
        }
        Ok(())
    }
}

/// How long a probe may wait for Postgres or Docker.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

struct ControllerProbes {
    ctx: Arc<Context>,
    queue: WorkQueue<SandboxId>,
    readiness: Readiness,
}

#[async_trait]
impl Probes for ControllerProbes {
    async fn before_scrape(&self) {
        let m = &self.ctx.metrics;
        let (longest, total) = self.queue.running_times();
        m.longest_running
            .with_label_values(&[CONTROLLER])
            .set(longest.as_secs_f64());
        m.unfinished_work
            .with_label_values(&[CONTROLLER])
            .set(total.as_secs_f64());
        let looping = self.ctx.heal_loops.looping();
        if !looping.is_empty() {
            tracing::warn!(sandboxes = ?looping, "sandboxes in a heal loop");
        }
        m.heal_loops.set(looping.len() as i64);
        // Fleet gauges; on a timeout or error the last values stay.
        let fleet = async {
            let statuses = store::list_status(&self.ctx.pool).await.ok()?;
            let containers =
                runtime::list_managed(&self.ctx.docker, &self.ctx.config.deployment, None)
                    .await
                    .ok()?;
            Some((statuses, containers))
        };
        if let Ok(Some((statuses, containers))) = tokio::time::timeout(PROBE_TIMEOUT, fleet).await {
            publish_fleet(m, &statuses, &containers);
        }
    }

    async fn ready(&self) -> Result<(), String> {
        if !self.readiness.is_ready() {
            return Err("initial lists not loaded yet".into());
        }
        match tokio::time::timeout(
            PROBE_TIMEOUT,
            sqlx::query("SELECT 1").execute(&self.ctx.pool),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("state database unreachable: {e}")),
            Err(_) => return Err("state database did not answer within 2s".into()),
        }
        match tokio::time::timeout(PROBE_TIMEOUT, self.ctx.docker.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("docker unreachable: {e}")),
            Err(_) => Err("docker did not answer within 2s".into()),
        }
    }
}

/// Sets the per-phase and per-engine/state gauges from full listings.
fn publish_fleet(metrics: &Metrics, statuses: &[SandboxStatus], containers: &[ObservedContainer]) {
    for phase in Phase::ALL {
        let n = statuses.iter().filter(|s| s.phase == phase).count();
        metrics
            .sandboxes
            .with_label_values(&[phase.as_str()])
            .set(n as i64);
    }
    for engine in crate::engine::REGISTRY {
        for state in ContainerState::ALL {
            let n = containers
                .iter()
                .filter(|c| c.labels.engine == engine.name() && c.state == state)
                .count();
            metrics
                .containers
                .with_label_values(&[engine.name(), state.as_str()])
                .set(n as i64);
        }
    }
}

/// Lists both sides in full and enqueues every sandbox found; counts the
/// containers whose state the event stream had not reported (drift) and
/// refreshes the per-phase gauge.
async fn relist(
    ctx: &Context,
    queue: &WorkQueue<SandboxId>,
    known: &KnownContainers,
    count_drift: bool,
) -> Result<(), ControllerError> {
    let mut ids: BTreeSet<String> = store::list_ids(&ctx.pool).await?.into_iter().collect();
    let containers = runtime::list_managed(&ctx.docker, &ctx.config.deployment, None).await?;
    ids.extend(containers.iter().map(|c| c.labels.sandbox.to_string()));
    let listed: Vec<_> = containers.iter().map(|c| (c.id.clone(), c.state)).collect();
    let drift = known.reconcile_with(&listed);
    if count_drift && drift > 0 {
        ctx.metrics.relist_drift.inc_by(drift as u64);
        tracing::info!(
            drift,
            "relist found container changes the event stream missed"
        );
    }
    for raw in &ids {
        match SandboxId::parse(raw) {
            Ok(id) => queue.add(id),
            Err(e) => tracing::warn!(error = %e, "skipping a row with an invalid id"),
        }
    }
    let statuses = store::list_status(&ctx.pool).await?;
    publish_fleet(&ctx.metrics, &statuses, &containers);
    ctx.metrics.relists.inc();
    tracing::debug!(
        sandboxes = ids.len(),
        containers = containers.len(),
        "relisted"
    );
    Ok(())
}

/// Relists every `relist_interval`, and at once when a watcher reconnects.
async fn relist_loop(
    ctx: Arc<Context>,
    queue: WorkQueue<SandboxId>,
    known: Arc<KnownContainers>,
    relist_now: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(ctx.config.relist_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // immediate; the initial relist already ran
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = relist_now.notified() => tick.reset(),
        }
        if let Err(e) = relist(&ctx, &queue, &known, true).await {
            tracing::warn!(error = %e, "relist failed; will try again next interval");
        }
    }
}
