//! Relists: both sides listed in full, every sandbox found enqueued. They
//! run at start (the readiness gate waits for the first), after a watch
//! stream reconnects, and periodically; each counts the container changes
//! the event stream had not reported (drift). After a reconnect every key's
//! backoff is cut short: what failed while Docker or the database was away
//! is tried again now, not minutes later.

use super::breaker::Change;
use super::{Context, ControllerError};
use crate::domain::container::ObservedContainer;
use crate::domain::id::SandboxId;
use crate::domain::identity;
use crate::domain::sandbox::SandboxStatus;
use crate::sched::WorkQueue;
use crate::watch::KnownContainers;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::sync::Notify;

/// How a relist enqueues what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueue {
    /// As hints: a key backing off keeps its backoff.
    Hint,
    /// As new requests: backoffs are cut short (after a reconnect).
    Fresh,
}

/// Lists both sides in full and enqueues every sandbox found (another
/// state database's containers are counted and reported, see
/// `controller::foreign`). The first relist reads the state database's
/// identity, sets the baseline and counts no drift.
pub(crate) async fn relist(
    ctx: &Context,
    queue: &WorkQueue<SandboxId>,
    known: &KnownContainers,
    count_drift: bool,
    enqueue: Enqueue,
) -> Result<(), ControllerError> {
    let state = ctx.state_id().await?;
    let desired: BTreeSet<String> = ctx.store.desired_ids().await?.into_iter().collect();
    let mut ids = desired.clone();
    let mut containers = ctx.runtime.list(&ctx.config.deployment, None).await?;
    // Claimed warm-pool containers are their sandboxes'; unclaimed ones
    // are nobody's (never reaped, healed or counted as orphans).
    let pooled = super::pool::relisted(ctx).await?;
    containers.extend(pooled.claimed);
    ids.extend(containers.iter().map(|c| c.labels.sandbox.to_string()));
    // A network whose sandbox is gone is removed by that sandbox's reconcile.
    let networks = ctx.runtime.networks(&ctx.config.deployment).await?;
    // So is a persistent sandbox's volume.
    let volumes = ctx.runtime.volumes(&ctx.config.deployment).await?;
    ids.extend(
        networks
            .iter()
            .chain(&volumes)
            .filter_map(|n| Some(n.sandbox.as_ref()?.to_string())),
    );
    let mut listed: Vec<_> = containers.iter().map(|c| (c.id.clone(), c.state)).collect();
    // Unclaimed pool containers' events are recorded too.
    listed.extend(
        pooled
            .states
            .into_iter()
            .filter(|(id, _)| !containers.iter().any(|c| &c.id == id)),
    );
    let drift = known.reconcile_with(&listed);
    let drift = if count_drift { drift } else { 0 };
    if drift > 0 {
        tracing::info!(
            drift,
            "relist found container changes the event stream missed"
        );
    }
    let statuses = ctx.store.list_status().await?;
    ids.extend(statuses.iter().map(|s| s.id.to_string()));
    let by_id: HashMap<&SandboxId, &SandboxStatus> = statuses.iter().map(|s| (&s.id, s)).collect();
    let (ours, foreign): (Vec<&ObservedContainer>, Vec<&ObservedContainer>) = containers
        .iter()
        .partition(|c| identity::is_ours(c, state, by_id.get(&c.labels.sandbox).copied()));
    // Another state database's containers are never reaped: the breaker
    // weighs this one's only.
    breaker_look(ctx, desired, &ours).await?;
    for raw in &ids {
        match SandboxId::parse(raw) {
            Ok(id) if enqueue == Enqueue::Fresh => queue.add_fresh(id),
            Ok(id) => queue.add(id),
            Err(e) => tracing::warn!(error = %e, "skipping a row with an invalid id"),
        }
    }
    ctx.foreign.report(state, &foreign, &networks, &volumes);
    ctx.metrics.foreign_containers(foreign.len());
    ctx.phases.relisted(&statuses, &ctx.metrics);
    ctx.metrics.containers(ctx.engines, &containers);
    ctx.metrics.relisted(drift);
    tracing::debug!(
        sandboxes = ids.len(),
        containers = containers.len(),
        "relisted"
    );
    Ok(())
}

/// How long the tombstone of a deleted row is kept.
const TOMBSTONES_KEPT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Looks at the fleet for the reaping circuit breaker (before anything is
/// enqueued, so that no reconcile reaps ahead of it) and records a trip.
async fn breaker_look(
    ctx: &Context,
    mut desired: BTreeSet<String>,
    containers: &[&ObservedContainer],
) -> Result<(), ControllerError> {
    // Rows deleted one by one were meant to go: only rows that vanished
    // without a trace count.
    desired.extend(ctx.store.released_ids(TOMBSTONES_KEPT).await?);
    let fleet: BTreeSet<&SandboxId> = containers.iter().map(|c| &c.labels.sandbox).collect();
    let missing: BTreeSet<SandboxId> = fleet
        .iter()
        .filter(|id| !desired.contains(id.as_str()))
        .map(|id| (*id).clone())
        .collect();
    let recorded = ctx.store.reaping().await?;
    let change = ctx.breaker.look(
        &ctx.config.breaker,
        &recorded,
        fleet.len(),
        &missing,
        ctx.clock.now(),
    );
    match change {
        Change::Tripped(reason) => {
            tracing::error!(missing = missing.len(), fleet = fleet.len(), reason = %reason, "reaping paused: too many desired rows missing at once");
            ctx.store.pause_reaping(&reason).await?;
            ctx.breaker.recorded();
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
    ctx.metrics
        .reaping(ctx.breaker.paused().is_some(), missing.len());
    Ok(())
}

/// Relists every `relist_interval`, and at once when a watcher reconnects.
pub(crate) async fn relist_loop(
    ctx: Arc<Context>,
    queue: WorkQueue<SandboxId>,
    known: Arc<KnownContainers>,
    relist_now: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(ctx.config.relist_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the initial relist already ran.
    tick.tick().await;
    // A reconnect's relist that failed is owed until one succeeds.
    let mut owed = Enqueue::Hint;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = relist_now.notified() => {
                tick.reset();
                owed = Enqueue::Fresh;
            }
        }
        match relist(&ctx, &queue, &known, true, owed).await {
            Ok(()) => owed = Enqueue::Hint,
            Err(e) => {
                tracing::warn!(error = %e, "relist failed; will try again next interval");
            }
        }
    }
}
