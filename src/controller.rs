//! The controller: watches as hints, relists as the truth, and a work queue
//! that runs `reconcile(id)` one key at a time.

use crate::clock::Clock;
use crate::config::ControllerConfig;
use crate::id::SandboxId;
use crate::metrics::Metrics;
use crate::model::Phase;
use crate::queue::{Outcome, QueueConfig, WorkQueue};
use crate::reconcile::{self, Context, Next};
use crate::runtime::{self, RuntimeError};
use crate::store::{self, StoreError};
use backon::{ExponentialBuilder, Retryable};
use bollard::Docker;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A running controller's parts.
pub struct Controller {
    ctx: Arc<Context>,
    queue: WorkQueue<SandboxId>,
    readiness: Readiness,
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
            ..QueueConfig::default()
        };
        metrics
            .max_concurrent
            .with_label_values(&[crate::metrics::CONTROLLER])
            .set(queue_config.concurrency as i64);
        let queue = WorkQueue::new(queue_config, metrics.clone());
        Self {
            ctx: Arc::new(Context {
                pool,
                docker,
                config,
                clock,
                metrics,
            }),
            queue,
            readiness: Readiness::default(),
        }
    }

    /// The readiness flag, for the HTTP server.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Runs until `shutdown` resolves; then finishes in-flight reconciles
    /// (bounded) and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ControllerError> {
        runtime::ensure_network(&self.ctx.docker, &self.ctx.config.network).await?;

        // Subscribe before the initial list, so no change falls in between.
        let listener = connect_listener(&self.ctx.pool).await?;
        relist(&self.ctx, &self.queue).await?;
        // Readiness gate: only now may anything be reaped or provisioned.
        self.readiness.set();
        tracing::info!(deployment = %self.ctx.config.deployment, "initial lists loaded; controller ready");

        let watch = tokio::spawn(watch_desired(
            listener,
            self.ctx.clone(),
            self.queue.clone(),
        ));
        let periodic = tokio::spawn(periodic_relist(self.ctx.clone(), self.queue.clone()));

        let ctx = self.ctx.clone();
        let handler = move |id: SandboxId| {
            let ctx = ctx.clone();
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
        watch.abort();
        periodic.abort();
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                "shutdown grace elapsed with reconciles still running"
            );
        }
        Ok(())
    }
}

/// Lists both sides in full and enqueues every id found, and refreshes the
/// per-phase gauge.
async fn relist(ctx: &Context, queue: &WorkQueue<SandboxId>) -> Result<(), ControllerError> {
    let mut ids: BTreeSet<String> = store::list_ids(&ctx.pool).await?.into_iter().collect();
    let containers = runtime::list_managed(&ctx.docker, &ctx.config.deployment, None).await?;
    ids.extend(containers.iter().map(|c| c.labels.sandbox.to_string()));
    for raw in &ids {
        match SandboxId::parse(raw) {
            Ok(id) => queue.add(id),
            Err(e) => tracing::warn!(error = %e, "skipping a row with an invalid id"),
        }
    }
    let statuses = store::list_status(&ctx.pool).await?;
    for phase in Phase::ALL {
        let n = statuses.iter().filter(|s| s.phase == phase).count();
        ctx.metrics
            .sandboxes
            .with_label_values(&[phase.as_str()])
            .set(n as i64);
    }
    ctx.metrics.relists.inc();
    tracing::debug!(
        sandboxes = ids.len(),
        containers = containers.len(),
        "relisted"
    );
    Ok(())
}

async fn periodic_relist(ctx: Arc<Context>, queue: WorkQueue<SandboxId>) {
    let mut tick = tokio::time::interval(ctx.config.relist_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the initial relist already ran
    loop {
        tick.tick().await;
        if let Err(e) = relist(&ctx, &queue).await {
            tracing::warn!(error = %e, "periodic relist failed; will try again next interval");
        }
    }
}

async fn connect_listener(pool: &PgPool) -> Result<PgListener, StoreError> {
    let mut listener = PgListener::connect_with(pool)
        .await
        .map_err(StoreError::Connect)?;
    listener
        .listen(store::DESIRED_CHANNEL)
        .await
        .map_err(StoreError::Connect)?;
    Ok(listener)
}

/// Turns NOTIFY into queue adds. NOTIFY is lost while disconnected, so
/// every reconnect is followed by a relist.
async fn watch_desired(mut listener: PgListener, ctx: Arc<Context>, queue: WorkQueue<SandboxId>) {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => {
                ctx.metrics.notify_wakeups.inc();
                match SandboxId::parse(n.payload()) {
                    Ok(id) => queue.add(id),
                    Err(e) => tracing::warn!(error = %e, "ignoring NOTIFY with an invalid id"),
                }
            }
            // Ok(None): the connection dropped; the next call reconnects.
            // Err: reconnecting failed. Either way notifications may be lost.
            other => {
                if let Err(e) = other {
                    tracing::warn!(error = %e, "NOTIFY stream failed; reconnecting");
                }
                ctx.metrics
                    .stream_restarts
                    .with_label_values(&["postgres"])
                    .inc();
                let reconnect = || async {
                    let l = connect_listener(&ctx.pool).await?;
                    relist(&ctx, &queue).await?;
                    Ok::<_, ControllerError>(l)
                };
                match reconnect
                    .retry(
                        ExponentialBuilder::default()
                            .with_min_delay(Duration::from_millis(200))
                            .with_max_delay(Duration::from_secs(30))
                            .without_max_times(),
                    )
                    .notify(|e, d| tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "reconnecting NOTIFY stream"))
                    .await
                {
                    Ok(l) => listener = l,
                    Err(e) => {
                        tracing::error!(error = %e, "NOTIFY stream gave up");
                        return;
                    }
                }
            }
        }
    }
}
