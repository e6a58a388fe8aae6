//! The controller: watches as hints, relists as the truth, and a work queue
//! that runs `reconcile(id)` one key at a time.

mod admission;
mod breaker;
mod bring_up;
mod checkpoint;
mod containers;
mod copy;
mod crash_loops;
mod env;
mod fence;
mod fleet;
mod foreign;
mod fork;
mod gone;
mod guard;
mod heal_loop;
mod image;
mod leader;
mod name_release;
pub mod network;
mod pause;
mod pool;
mod probes;
pub mod provision;
mod reach;
mod recheck;
mod reconcile;
mod relist;
mod rotation;
mod seed;
mod seed_template;
mod start;
pub mod template;
pub mod volume;
mod webhook;

pub use self::fence::{Fence, Fenced};
pub(crate) use self::guard::{GuardedRuntime, RuntimeDeadlines};
pub use self::image::ImageError;
pub use self::provision::ProvisionError;
pub use self::rotation::SwitchError;

use self::breaker::ReapBreaker;
use self::crash_loops::CrashLoops;
use self::env::Env;
use self::fleet::FleetPhases;
use self::foreign::Foreign;
use self::gone::GoneSince;
use self::heal_loop::HealLoops;
pub(crate) use self::leader::Elector;
use self::probes::ControllerProbes;
use self::start::Sources;
use crate::config::ControllerConfig;
use crate::domain::clock::Clock;
use crate::domain::id::SandboxId;
use crate::engine::Registry;
use crate::metrics::Metrics;
use crate::ports::runtime::{Runtime, RuntimeError};
use crate::ports::store::{Store, StoreError};
use crate::ports::webhook::WebhookTransport;
use crate::ports::Probes;
use crate::sched::{Failed, WorkQueue};
// The unit tests (`use super::*`) build queues of their own.
#[cfg(test)]
use crate::sched::QueueConfig;
use crate::watch::{self, DesiredRows, DockerEvents, KnownContainers, RemovedNetworks, Sink};
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

/// What every reconcile shares, split by owner: the ports and settings
/// every step reads ([`Env`]), and each in-memory ledger with the steps
/// that keep it. A step takes the owners it uses; only the reconcile, the
/// relist and provision, which run the other steps, take the whole.
pub(crate) struct Context {
    /// The ports, engines, settings, clock, metrics, fence and the orders
    /// seen on the event stream.
    pub(crate) env: Env,
    /// What a start draws from: the warm pool, seeds, templates, fork
    /// copies and image fetches.
    pub(crate) sources: Sources,
    /// What the heals remember.
    pub(crate) heals: Heals,
    /// What the reaps remember.
    pub(crate) reaps: Reaps,
    /// What each sandbox holds against its owner's quota and the host's
    /// memory budget, and the rows waiting for admission.
    pub(crate) admission: admission::Admission,
    /// Where what a reconcile publishes goes besides the status rows.
    pub(crate) outbox: Outbox,
    /// Another state database's objects reported so far.
    pub(crate) foreign: Foreign,
    /// Asks for a relist now.
    pub(crate) relist_now: Arc<Notify>,
}

/// What the heals remember, so that a sandbox or an engine that keeps
/// dying is reported and backed off rather than restarted in a loop.
#[derive(Default)]
pub(crate) struct Heals {
    /// Recent heals per sandbox, for heal-loop detection.
    pub(crate) heal_loops: HealLoops,
    /// Recent heals per engine, for the crash loop back-off.
    pub(crate) crash_loops: CrashLoops,
}

/// What the reaps remember, so that nothing is removed on one signal.
#[derive(Default)]
pub(crate) struct Reaps {
    /// When each deleted row was first seen missing (its grace counts
    /// from then).
    pub(crate) gone: GoneSince,
    /// The reaping circuit breaker.
    pub(crate) breaker: ReapBreaker,
}

/// Where a reconcile's published phases and events go besides the
/// status rows and `sandbox_events`.
pub(crate) struct Outbox {
    /// Each sandbox's last published phase, for the fleet gauges.
    pub(crate) phases: FleetPhases,
    /// Where recorded events go besides `sandbox_events` (the webhook).
    pub(crate) webhook: webhook::Notifier,
}

/// A running controller's parts.
pub struct Controller {
    ctx: Arc<Context>,
    elector: Arc<Elector>,
    queue: WorkQueue<SandboxId>,
    readiness: Readiness,
    known: Arc<KnownContainers>,
    relist_now: Arc<Notify>,
    /// The webhook's delivery task, started by [`Controller::run`].
    webhook: Option<webhook::Delivery>,
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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
    fn request(&self, id: SandboxId) {
        self.queue.add_fresh(id);
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

/// What a controller is made of. The composition root (`cli::run`) builds
/// every part: the ports already wrapped in their deadlines (and, for the
/// runtime, the fence), the elector that grants that fence, the work queue
/// and the webhook's transport. The controller only puts them to work.
pub(crate) struct Parts {
    /// The container runtime: every call bounded, every change fenced by
    /// [`Parts::fence`] (a [`GuardedRuntime`]).
    pub(crate) runtime: Arc<dyn Runtime>,
    /// The state store, every call bounded.
    pub(crate) store: Arc<dyn Store>,
    /// Where recorded events are POSTed, if a webhook is configured.
    pub(crate) webhook: Option<Arc<dyn WebhookTransport>>,
    /// Whether this process may act; the elector grants it.
    pub(crate) fence: Fence,
    /// Campaigns for and holds the leader lease.
    pub(crate) elector: Arc<Elector>,
    /// The queue of sandboxes to reconcile.
    pub(crate) queue: WorkQueue<SandboxId>,
    /// The engines this controller runs.
    pub(crate) engines: Registry,
    /// Configuration.
    pub(crate) config: ControllerConfig,
    /// The clock.
    pub(crate) clock: Arc<dyn Clock>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
}

impl Controller {
    /// A controller made of `parts`; nothing runs until [`Controller::run`].
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            runtime,
            store,
            webhook,
            fence,
            elector,
            queue,
            engines,
            config,
            clock,
            metrics,
        } = parts;
        let relist_now = Arc::new(Notify::new());
        let images = image::Fetches::new(runtime.clone(), &config, metrics.clone(), queue.clone());
        let (notifier, delivery) = match (&config.webhook, webhook) {
            (Some(w), Some(transport)) => {
                let (n, d) = webhook::channel(w, transport, metrics.clone());
                (n, Some(d))
            }
            _ => (webhook::Notifier::disabled(metrics.clone()), None),
        };
        let admission = admission::Admission::new(&config, queue.clone());
        let seeds = seed::Seeds::new(config.seed_loads);
        Self {
            elector,
            ctx: Arc::new(Context {
                env: Env {
                    runtime,
                    store,
                    engines,
                    config,
                    clock,
                    metrics,
                    fence,
                    state: tokio::sync::OnceCell::new(),
                    orders: Arc::default(),
                },
                sources: Sources {
                    pool: pool::Pool::default(),
                    seeds,
                    templates: template::Templates::default(),
                    forks: fork::Copies::default(),
                    images,
                },
                heals: Heals::default(),
                reaps: Reaps::default(),
                admission,
                outbox: Outbox {
                    phases: FleetPhases::default(),
                    webhook: notifier,
                },
                foreign: Foreign::default(),
                relist_now: relist_now.clone(),
            }),
            queue,
            readiness: Readiness::default(),
            known: Arc::new(KnownContainers::default()),
            relist_now,
            webhook: delivery,
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
            elector: self.elector.clone(),
            queue: self.queue.clone(),
            readiness: self.readiness.clone(),
        })
    }

    /// Runs until `shutdown` resolves: stands by until this process holds
    /// the leader lease, then leads (watches, relists, reconciles) while it
    /// holds it, and stands by again if it loses it. On `shutdown` it stops
    /// taking new work, lets in-flight reconciles finish within the
    /// shutdown grace, gives the lease up and returns.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ControllerError> {
        // The webhook's sender lives as long as this run; only a leader's
        // reconciles record events, so only the leader sends.
        let _webhook = self
            .webhook
            .take()
            .map(|d| AbortOnDrop(tokio::spawn(d.run())));
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let term = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                term = self.elector.acquire() => term,
            };
            // What this process remembered from an earlier term may be stale.
            self.ctx.reaps.gone.clear();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let lead = self.lead(async {
                let _ = stopped.await;
            });
            let mut lead = std::pin::pin!(lead);
            let hold = self.elector.hold(term);
            let mut hold = std::pin::pin!(hold);
            let mut stop = Some(stop);
            let mut lost = false;
            let mut shutting_down = false;
            let result = loop {
                tokio::select! {
                    biased;
                    result = &mut lead => break result,
                    () = &mut shutdown, if !shutting_down => {
                        shutting_down = true;
                        if let Some(stop) = stop.take() {
                            let _ = stop.send(());
                        }
                    }
                    () = &mut hold, if !lost => {
                        // The fence is closed already: in-flight reconciles
                        // fail at their next Docker call or status write.
                        lost = true;
                        if let Some(stop) = stop.take() {
                            let _ = stop.send(());
                        }
                    }
                }
            };
            if !lost {
                self.elector.release(term).await;
            }
            if shutting_down || result.is_err() {
                return result;
            }
        }
    }

    /// Leads until `stop` resolves: the initial lists, the watches, the
    /// periodic relist and the work queue.
    async fn lead(&self, stop: impl Future<Output = ()> + Send) -> Result<(), ControllerError> {
        let ctx = self.ctx.clone();
        let mut shutdown = std::pin::pin!(stop);
        // A database or daemon that fails now (a LISTEN refused, a network
        // create timed out) is retried like the initial lists, not the end
        // of the process: the simulation found a term that began with one
        // failed LISTEN leave the fleet without a controller.
        let mut delay = Duration::from_millis(200);
        let mut tasks = loop {
            match self.begin_term().await {
                Ok(tasks) => break tasks,
                Err(e) => {
                    #[cfg(any(test, feature = "simulation"))]
                    if crate::domain::mutation::on(
                        crate::domain::mutation::Mutation::QuitOnWatchFailure,
                    ) {
                        return Err(e);
                    }
                    tracing::warn!(
                        error = %e,
                        retry_in_ms = delay.as_millis() as u64,
                        "starting the watches failed; not ready until they start"
                    );
                    tokio::select! {
                        biased;
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        if !self.load_initial_lists(&mut shutdown).await {
            return Ok(());
        }
        // Readiness gate: only now may anything be reaped or provisioned.
        self.readiness.set(true);
        template::prepare(&ctx.env, &ctx.sources.templates).await;
        tracing::info!(deployment = %ctx.env.config.deployment, "initial lists loaded; controller ready");

        tasks.0.push(tokio::spawn(relist::relist_loop(
            ctx.clone(),
            self.queue.clone(),
            self.known.clone(),
            self.relist_now.clone(),
        )));
        tasks.0.push(tokio::spawn(pool::fill::refill_loop(
            ctx.clone(),
            self.queue.clone(),
        )));

        let handler_ctx = ctx.clone();
        let handler = move |id: SandboxId| {
            let ctx = handler_ctx.clone();
            async move {
                reconcile::reconcile(&ctx, &id).await.map_err(|e| {
                    tracing::warn!(sandbox = %id, error = %e, "reconcile failed; retrying with backoff");
                    Failed
                })
            }
        };
        let abandoned = self.queue.run(handler, shutdown).await;
        self.readiness.set(false);
        drop(tasks);
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                grace_ms = ctx.env.config.shutdown_grace.as_millis() as u64,
                "shutdown grace elapsed with reconciles still running"
            );
        }
        Ok(())
    }

    /// What a term needs before its initial lists: the shared network (if
    /// the layout has one) and the watches.
    async fn begin_term(&self) -> Result<Tasks, ControllerError> {
        if let Some(shared) = network::shared_spec(&self.ctx.env) {
            self.ctx.env.runtime.ensure_network(&shared).await?;
        }
        self.watch().await
    }

    /// Follows Docker's events, removed networks and the desired rows'
    /// notifications, each on a task of its own. Both streams are
    /// subscribed to before the initial lists, so no change falls in
    /// between.
    async fn watch(&self) -> Result<Tasks, ControllerError> {
        let ctx = &self.ctx;
        let sink: Arc<dyn Sink> = Arc::new(QueueSink {
            queue: self.queue.clone(),
            relist_now: self.relist_now.clone(),
        });
        let notifications = ctx.env.store.watch_desired().await?;
        let docker_watch = tokio::spawn(watch::follow(
            DockerEvents::new(
                ctx.env.runtime.clone(),
                ctx.env.config.deployment.clone(),
                self.known.clone(),
                ctx.env.metrics.clone(),
            )
            .with_claims(ctx.sources.pool.index.clone())
            .with_orders(ctx.env.orders.clone()),
            None,
            ctx.env.metrics.clone(),
            sink.clone(),
        ));
        let network_watch = tokio::spawn(watch::follow(
            RemovedNetworks::new(
                ctx.env.runtime.clone(),
                ctx.env.config.deployment.clone(),
                network::shared_spec(&ctx.env).map(|n| n.name),
            ),
            None,
            ctx.env.metrics.clone(),
            sink.clone(),
        ));
        let pg_watch = tokio::spawn(watch::follow(
            DesiredRows::new(ctx.env.store.clone(), ctx.env.metrics.clone()),
            Some(notifications),
            ctx.env.metrics.clone(),
            sink,
        ));
        Ok(Tasks(vec![docker_watch, network_watch, pg_watch]))
    }

    /// The warm pool of this term (it starts from what it lists, before the
    /// initial lists, which then see claimed containers as their
    /// sandboxes'), then the initial lists, each retried until it loads (a
    /// state database that is locked or restarting must not end the
    /// controller): not ready meanwhile. False when `shutdown` came first.
    async fn load_initial_lists(
        &self,
        shutdown: &mut std::pin::Pin<&mut (impl Future<Output = ()> + Send)>,
    ) -> bool {
        let ctx = &self.ctx;
        while let Err(e) = pool::start_term(&ctx.env, &ctx.sources.pool).await {
            tracing::warn!(error = %e, "reading the warm pool failed; retrying");
            tokio::select! {
                biased;
                () = &mut *shutdown => return false,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let mut delay = Duration::from_millis(200);
        while let Err(e) = relist::relist(
            ctx,
            &self.queue,
            &self.known,
            false,
            relist::Enqueue::Hint,
            relist::Scope::Unconverged,
        )
        .await
        {
            tracing::warn!(
                error = %e,
                retry_in_ms = delay.as_millis() as u64,
                "initial lists failed; not ready until they load"
            );
            tokio::select! {
                biased;
                () = &mut *shutdown => return false,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        true
    }
}

/// A term's background tasks (watches, relist loop, pool refill), aborted
/// together when the term ends, however it ends.
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests;
