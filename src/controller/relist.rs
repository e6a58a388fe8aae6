//! Relists: both sides listed in full, every sandbox found enqueued unless
//! the lists show it converged (see [`crate::domain::resync`]): an idle
//! fleet costs a few lists per relist, not a few Docker calls per sandbox.
//! They run at start (the readiness gate waits for the first), after a
//! watch stream reconnects, and periodically; each counts the container
//! changes the event stream had not reported (drift). A full resync, which
//! reconciles every sandbox whatever the lists show, runs every
//! `--resync-interval` and after a reconnect. After a reconnect every key's
//! backoff is cut short too: what failed while Docker or the database was
//! away is tried again now, not minutes later.

use super::breaker::Change;
use super::{Context, ControllerError};
use crate::config::NetworkLayout;
use crate::domain::container::ObservedContainer;
use crate::domain::id::SandboxId;
use crate::domain::identity;
use crate::domain::plan::Policy;
use crate::domain::resync::{self, Judgement, Snapshot};
use crate::domain::sandbox::{DesiredSandbox, Phase, SandboxStatus};
use crate::ports::runtime::ObservedResource;
use crate::sched::WorkQueue;
use crate::watch::KnownContainers;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
// Randomly seeded hash tables (ids are hashed several times per row).
use crate::fleet_hash::{HashMap, HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How a relist enqueues what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueue {
    /// As hints: a key backing off keeps its backoff.
    Hint,
    /// As new requests: backoffs are cut short (after a reconnect).
    Fresh,
}

/// Which of the sandboxes found a relist reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every one (a full resync).
    Every,
    /// Those the lists do not show converged.
    Unconverged,
}

/// Lists both sides in full and enqueues every sandbox found that `scope`
/// asks for (another state database's containers are counted and
/// reported, see `controller::foreign`). The first relist reads the state
/// database's identity, sets the baseline and counts no drift.
pub(crate) async fn relist(
    ctx: &Arc<Context>,
    queue: &WorkQueue<SandboxId>,
    known: &KnownContainers,
    count_drift: bool,
    enqueue: Enqueue,
    scope: Scope,
) -> Result<(), ControllerError> {
    let state = ctx.env.state_id().await?;
    // What admission changes from here on is newer than these lists.
    let mark = super::admission::mark(&ctx.admission);
    // What the breaker's look is as recent as: the lists, not the moment
    // it weighs them (the simulation found a reap approved by a look whose
    // lists predated the truncate that took the row).
    let listed_at = ctx.env.clock.now();
    let mut lists = Lists::read(ctx).await?;
    // A warm-pool network a sandbox adopted is its network while its
    // status says so, whatever happens to the container it came with.
    let pool_prefix = crate::domain::network::pool_network_prefix(&ctx.env.config.deployment);
    let adopted: std::collections::HashSet<&str> = lists
        .statuses
        .iter()
        .filter_map(|s| s.network.as_deref())
        .filter(|n| n.starts_with(&pool_prefix))
        .collect();
    super::pool::remove_orphan_networks(
        &ctx.env,
        &ctx.sources.pool,
        &lists.pooled,
        &lists.networks,
        &adopted,
    )
    .await?;
    // After the networks this relist removed: their bridges go with them.
    super::network::remove_stale_bridges(&ctx.env).await;
    // Each sandbox's containers side by side, for the plans below.
    lists
        .containers
        .sort_unstable_by(|a, b| a.labels.sandbox.cmp(&b.labels.sandbox));
    let drift = lists.drift(known);
    let drift = if count_drift { drift } else { 0 };
    if drift > 0 {
        tracing::info!(
            drift,
            "relist found container changes the event stream missed"
        );
    }
    let Lists {
        rows,
        statuses,
        containers,
        networks,
        volumes,
        ..
    } = &lists;
    let by_id: HashMap<&SandboxId, &SandboxStatus> = statuses.iter().map(|s| (&s.id, s)).collect();
    let (ours, foreign): (Vec<&ObservedContainer>, Vec<&ObservedContainer>) = containers
        .iter()
        .partition(|c| identity::is_ours(c, state, by_id.get(&c.labels.sandbox).copied()));
    let desired: HashSet<&SandboxId> = rows.iter().map(|d| &d.id).collect();
    // Another state database's containers are never reaped: the breaker
    // weighs this one's only.
    breaker_look(ctx, &desired, &ours, statuses, listed_at).await?;
    let judge = Judge::new(ctx, containers, &foreign, &by_id, networks);
    let (due, converged) = select_due(&lists, &judge, &desired, scope, queue);
    if count_drift {
        let seen: HashSet<&SandboxId> = desired
            .iter()
            .copied()
            .chain(containers.iter().map(|c| &c.labels.sandbox))
            .chain(statuses.iter().map(|s| &s.id))
            .collect();
        super::admission::prune(&ctx.env, &ctx.admission, mark, &seen);
    } else {
        // A term's first relist (no reconcile runs yet): the ledger is
        // what the lists show.
        super::admission::rebuild(&ctx.env, &ctx.admission, rows, &ours, &by_id, &due);
    }
    let sandboxes = converged + due.len();
    for id in due {
        match enqueue {
            Enqueue::Fresh => queue.add_fresh(id.clone()),
            Enqueue::Hint => queue.add(id.clone()),
        }
    }
    ctx.env.metrics.fleet.relist_converged(converged);
    ctx.foreign.report(state, &foreign, networks, volumes);
    super::volume::publish_use(&ctx.env, volumes).await;
    super::seed::collect(&ctx.env, &ctx.sources.seeds, rows, volumes).await;
    ctx.env.metrics.fleet.foreign_containers(foreign.len());
    ctx.outbox.phases.relisted(statuses, &ctx.env.metrics);
    ctx.env
        .metrics
        .fleet
        .containers(ctx.env.engines, containers);
    ctx.env.metrics.fleet.relisted(drift);
    tracing::debug!(
        sandboxes,
        converged,
        containers = containers.len(),
        full = scope == Scope::Every,
        "relisted"
    );
    Ok(())
}

/// Both sides of a relist, listed in full.
struct Lists {
    rows: Vec<DesiredSandbox>,
    statuses: Vec<SandboxStatus>,
    /// Sandboxes with a checkpoint or reset requested and not done.
    pending: Vec<SandboxId>,
    /// The deployment's containers, claimed warm-pool ones included.
    containers: Vec<ObservedContainer>,
    /// Every warm-pool container, claimed or not.
    pooled: Vec<crate::domain::pool::PooledContainer>,
    networks: Vec<ObservedResource>,
    volumes: Vec<ObservedResource>,
}

impl Lists {
    /// The state database is read while Docker is listed, each side on a
    /// task of its own: decoding a large fleet's lists is work, and two
    /// workers do it side by side.
    async fn read(ctx: &Arc<Context>) -> Result<Lists, ControllerError> {
        let store_side = Side::spawn({
            let ctx = ctx.clone();
            async move {
                let rows = ctx.env.store.list_desired().await?;
                // Without secrets: the judge needs none, and a fleet's
                // credentials are most of its status rows' bytes.
                let statuses = ctx.env.store.list_status_redacted().await?;
                // Requests that a NOTIFY announced, if it came: a relist
                // never relies on it (issue 50: a tenant can make the
                // database skip notifications).
                let pending = ctx.env.store.pending_work().await?;
                // Only a gauge and a counter: a failure costs a stale one.
                match ctx.env.store.notify_queue().await {
                    Ok(queue) => ctx.env.metrics.watch.notify_queue(queue),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read the notification queue's usage; the next relist tries again")
                    }
                }
                // Events age out here (each sandbox's are bounded as they
                // are written); a failure costs nothing but a later try.
                match ctx
                    .env
                    .store
                    .prune_events(ctx.env.config.event_retention)
                    .await
                {
                    Ok(0) => {}
                    Ok(pruned) => tracing::debug!(pruned, "old events deleted"),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not delete old events; the next relist tries again")
                    }
                }
                // So do seeds no row has named for --seed-retention.
                match ctx
                    .env
                    .store
                    .prune_seeds(ctx.env.config.seed_retention)
                    .await
                {
                    Ok(0) => {}
                    Ok(pruned) => tracing::info!(
                        pruned,
                        retention_s = ctx.env.config.seed_retention.as_secs(),
                        "deleted seeds no row named within --seed-retention"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not delete unnamed seeds; the next relist tries again")
                    }
                }
                Ok::<_, ControllerError>((rows, statuses, pending))
            }
        });
        let docker_side = Side::spawn({
            let ctx = ctx.clone();
            async move {
                let deployment = &ctx.env.config.deployment;
                // Unclaimed pool containers are nobody's (never reaped,
                // healed or counted as orphans).
                let (containers, pooled) =
                    super::containers::of_every_sandbox(&ctx.env, &ctx.sources.pool).await?;
                // A network whose sandbox is gone is removed by that
                // sandbox's reconcile; so is a persistent sandbox's volume.
                let networks = ctx.env.runtime.networks(deployment).await?;
                let volumes = ctx.env.runtime.volumes(deployment).await?;
                Ok::<_, ControllerError>((containers, pooled, networks, volumes))
            }
        });
        let ((rows, statuses, pending), (containers, pooled, networks, volumes)) =
            tokio::try_join!(store_side.join(), docker_side.join())?;
        Ok(Lists {
            rows,
            statuses,
            pending,
            containers,
            pooled,
            networks,
            volumes,
        })
    }

    /// The container changes the event stream had not reported. Unclaimed
    /// pool containers' events are recorded too (a claimed one is in
    /// `containers` as well, and is counted once).
    fn drift(&self, known: &KnownContainers) -> usize {
        let listed = self
            .containers
            .iter()
            .map(|c| (&c.id, c.state))
            .chain(self.pooled.iter().map(|p| (&p.id, p.state)));
        known.reconcile_with(listed)
    }
}

/// The sandboxes a relist reconciles (those `scope` asks for, and what is
/// left of sandboxes without a row), and how many rows it found converged.
/// A converged row that expires or may go idle is looked at again then (a
/// reconcile would have asked for the same look).
fn select_due<'a>(
    lists: &'a Lists,
    judge: &Judge<'_>,
    desired: &HashSet<&'a SandboxId>,
    scope: Scope,
    queue: &WorkQueue<SandboxId>,
) -> (BTreeSet<&'a SandboxId>, usize) {
    let mut due: BTreeSet<&SandboxId> = BTreeSet::new();
    let mut converged = 0;
    // A pending checkpoint or reset is work whatever the lists show.
    let pending: HashSet<&SandboxId> = lists.pending.iter().collect();
    for row in &lists.rows {
        if pending.contains(&row.id) {
            due.insert(&row.id);
            continue;
        }
        match scope {
            Scope::Every => {
                due.insert(&row.id);
            }
            Scope::Unconverged => match judge.judge(row) {
                Judgement::Reconcile => {
                    due.insert(&row.id);
                }
                Judgement::Converged { recheck_at } => {
                    converged += 1;
                    if let Some(at) = recheck_at {
                        let after = (at - judge.now).to_std().unwrap_or_default();
                        queue.add_after(row.id.clone(), after);
                    }
                }
            },
        }
    }
    // Sandboxes without a row: what is left of them goes.
    due.extend(
        lists
            .containers
            .iter()
            .map(|c| &c.labels.sandbox)
            .chain(lists.statuses.iter().map(|s| &s.id))
            .chain(
                lists
                    .networks
                    .iter()
                    .chain(&lists.volumes)
                    .filter_map(|n| n.sandbox.as_ref()),
            )
            .filter(|id| !desired.contains(id)),
    );
    (due, converged)
}

/// Judges from a relist's lists which desired rows are converged
/// (reconciling them now would change nothing) and until when.
struct Judge<'a> {
    ctx: &'a Context,
    /// Each sandbox's containers (of this state database or not).
    observed: HashMap<&'a SandboxId, &'a [ObservedContainer]>,
    /// Sandboxes with another state database's containers.
    foreign: HashSet<&'a SandboxId>,
    statuses: &'a HashMap<&'a SandboxId, &'a SandboxStatus>,
    /// The deployment's networks, by name.
    networks: HashSet<&'a str>,
    now: chrono::DateTime<chrono::Utc>,
    policy: Policy,
}

impl<'a> Judge<'a> {
    /// `containers` sorted by sandbox.
    fn new(
        ctx: &'a Context,
        containers: &'a [ObservedContainer],
        foreign: &[&'a ObservedContainer],
        statuses: &'a HashMap<&'a SandboxId, &'a SandboxStatus>,
        networks: &'a [ObservedResource],
    ) -> Self {
        Judge {
            ctx,
            observed: containers
                .chunk_by(|a, b| a.labels.sandbox == b.labels.sandbox)
                .map(|group| (&group[0].labels.sandbox, group))
                .collect(),
            foreign: foreign.iter().map(|c| &c.labels.sandbox).collect(),
            statuses,
            networks: networks.iter().map(|n| n.name.as_str()).collect(),
            now: ctx.env.clock.now(),
            policy: ctx.env.policy(),
        }
    }

    fn judge(&self, row: &DesiredSandbox) -> Judgement {
        let status = self.statuses.get(&row.id).copied();
        let network = super::network::sandbox_network(
            &self.ctx.env,
            &row.id,
            status.and_then(|s| s.network.as_deref()),
        );
        let exists = match self.ctx.env.config.network {
            NetworkLayout::PerSandbox { .. } => self.networks.contains(network.as_str()),
            // Created at start; its engines' lists show it if it is there.
            NetworkLayout::Shared { .. } => true,
        };
        let snapshot = Snapshot {
            desired: Some(row),
            observed: self.observed.get(&row.id).copied().unwrap_or_default(),
            status,
            network: exists.then_some(network.as_str()),
            foreign: self.foreign.contains(&row.id),
        };
        resync::judge(&snapshot, self.now, &self.policy)
    }
}

/// One side of a relist's lists, listed on a task of its own; aborted if
/// the relist is dropped (at shutdown), so that no list outlives it.
struct Side<T>(tokio::task::JoinHandle<T>);

impl<T: Send + 'static> Side<T> {
    fn spawn(list: impl std::future::Future<Output = T> + Send + 'static) -> Self {
        Side(tokio::spawn(list))
    }

    /// The side's lists; a panic while listing goes on in the relist, as
    /// it would have had the relist listed itself.
    async fn join(mut self) -> T {
        match (&mut self.0).await {
            Ok(lists) => lists,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only dropping the side aborts its task, and then nothing joins it.
            Err(e) => unreachable!("a relist's list task was cancelled while joined: {e}"),
        }
    }
}

impl<T> Drop for Side<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long the tombstone of a deleted row is kept.
const TOMBSTONES_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Looks at the fleet for the reaping circuit breaker (before anything is
/// enqueued, so that no reconcile reaps ahead of it) and records a trip.
async fn breaker_look(
    ctx: &Context,
    desired: &HashSet<&SandboxId>,
    containers: &[&ObservedContainer],
    statuses: &[SandboxStatus],
    listed_at: chrono::DateTime<chrono::Utc>,
) -> Result<(), ControllerError> {
    // Rows deleted one by one were meant to go: they neither count as
    // lost nor in the fleet a burst is weighed against. (Counting them in
    // the fleet would let the share fall, and the breaker miss a burst,
    // merely because released sandboxes still wait out their grace; and
    // rise again as they are reaped, after the look that let the burst
    // go: simulation seed 19963.)
    let released: HashSet<String> = ctx
        .env
        .store
        .released_ids(TOMBSTONES_KEPT)
        .await?
        .into_iter()
        .collect();
    // A full list may answer from an older view (a cache, a daemon under
    // load) and miss containers made since. What this controller recorded
    // itself counts too: a status that serves engines (its containers were
    // up when it was written), and a reconcile that found a row missing
    // with containers (it listed that sandbox itself). Simulation seeds
    // 59671, 91996 and 326400: stale lists hid a truncate of most of the
    // fleet.
    let seen_gone = ctx.reaps.gone.with_containers();
    let serving = statuses
        .iter()
        .filter(|s| {
            matches!(s.phase, Phase::Ready | Phase::Healing | Phase::Paused)
                && !s.services.is_empty()
        })
        .map(|s| &s.id);
    let fleet: HashSet<&SandboxId> = containers
        .iter()
        .map(|c| &c.labels.sandbox)
        .chain(&seen_gone)
        .chain(serving)
        .filter(|id| desired.contains(*id) || !released.contains(id.as_str()))
        .collect();
    let missing: BTreeSet<SandboxId> = fleet
        .iter()
        .filter(|id| !desired.contains(*id))
        .map(|id| (*id).clone())
        .collect();
    let recorded = ctx.env.store.reaping().await?;
    let change = ctx.reaps.breaker.look(
        &ctx.env.config.breaker,
        &recorded,
        fleet.len(),
        &missing,
        listed_at,
    );
    match change {
        Change::Tripped(reason) => {
            tracing::error!(missing = missing.len(), fleet = fleet.len(), reason = %reason, "reaping paused: too many desired rows missing at once");
            ctx.env.store.pause_reaping(&reason).await?;
            ctx.reaps.breaker.recorded();
        }
        Change::Resumed(released) => {
            tracing::warn!(
                released,
                "reaping resumed by an operator; the sandboxes whose rows are missing now go"
            );
        }
        Change::Adopted => {
            tracing::warn!(reason = %recorded.reason, "reaping is paused (recorded in the state database); `sandboxd resume-reaping` resumes it");
        }
        Change::None => {}
    }
    ctx.env
        .metrics
        .fleet
        .reaping(ctx.reaps.breaker.paused().is_some(), missing.len());
    Ok(())
}

/// When a failed relist is tried again: after a second (or the interval,
/// if shorter), doubling up to the interval.
fn retry_delays(interval: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(interval.min(Duration::from_secs(1)))
        .with_max_delay(interval)
        .without_max_times()
        .build()
}

/// Relists every `relist_interval`, and at once when a watcher reconnects.
pub(crate) async fn relist_loop(
    ctx: Arc<Context>,
    queue: WorkQueue<SandboxId>,
    known: Arc<KnownContainers>,
    relist_now: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(ctx.env.config.relist_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the initial relist already ran.
    tick.tick().await;
    // A reconnect's relist that failed is owed until one succeeds.
    let mut owed = Enqueue::Hint;
    // A failed relist is tried again soon rather than an interval later:
    // the relist a truncate woke is the breaker's look at that burst, and
    // by the next interval rows may be back and the fleet changed, so
    // that the burst no longer shows (simulation seeds 19963, 30181).
    let mut retries: Option<ExponentialBackoff> = None;
    let mut resynced = Instant::now();
    loop {
        // Biased, as every select of the controller: the same branch wins
        // a tie every time, so a simulated world replays (testing::dst).
        tokio::select! {
            biased;
            _ = relist_now.notified() => {
                tick.reset();
                owed = Enqueue::Fresh;
            }
            _ = tick.tick() => {}
        }
        // What the lists cannot show (a stranger connected to a sandbox's
        // network, say) is looked at by a full resync.
        let scope =
            if owed == Enqueue::Fresh || resynced.elapsed() >= ctx.env.config.resync_interval {
                Scope::Every
            } else {
                Scope::Unconverged
            };
        match relist(&ctx, &queue, &known, true, owed, scope).await {
            Ok(()) => {
                owed = Enqueue::Hint;
                retries = None;
                if scope == Scope::Every {
                    resynced = Instant::now();
                }
            }
            Err(e) => {
                let interval = ctx.env.config.relist_interval;
                let retry_in = retries
                    .get_or_insert_with(|| retry_delays(interval))
                    .next()
                    .unwrap_or(interval);
                tick.reset_after(retry_in);
                tracing::warn!(error = %e, retry_in_ms = retry_in.as_millis() as u64, "relist failed; trying again");
            }
        }
    }
}
