//! `reconcile(id)`: converges one sandbox in five steps, each reading what
//! the ones before it found ([`converge`]):
//!
//! 1. **read** the row, the containers, the status of the row's
//!    incarnation and the owner container;
//! 2. **decide** the plan ([`plan`](crate::domain::plan)) and the pause
//!    step, planning once more if a client was seen using an engine about
//!    to be frozen or released;
//! 3. **gate** it: look up admission, images, crash loops and the reaping
//!    breaker, then let the pure [`gate`](crate::domain::gate) say what
//!    may go now and what is held;
//! 4. **act** on what the gates let through;
//! 5. **publish** the status the pure [`status`](crate::domain::status)
//!    decides, and settle the admission ledger;
//!
//! then follow up (checkpoints and resets, when to look again).
//! Level-triggered: it never trusts what woke it.
//!
//! The status is written by `publish`, with two writes made while acting
//! because they must land before what follows them: `provisioning` (or
//! `healing`) before the first container is created, so that a create
//! that hangs is seen as one, and a rotation's commit point
//! ([`super::rotation`]), before its old container is removed.

use super::breaker::Held;
use super::env::Env;
use super::image::Availability;
use super::rotation::{self, Commit};
use super::Context;
use super::{admission, checkpoint, containers, network, pool, provision, recheck, volume};
use crate::config::NetworkLayout;
use crate::domain::attach;
use crate::domain::container::ObservedContainer;
use crate::domain::container::RunState;
use crate::domain::crash_loop::{self, HealGate};
use crate::domain::death;
use crate::domain::event::{self, Event, Journal};
use crate::domain::gate::{self, Gated, Reaping};
use crate::domain::id::{EngineName, SandboxId};
use crate::domain::identity::{self, Incarnation, StateId};
use crate::domain::pause;
use crate::domain::plan::{
    self, HealCause, OwnerState, Plan, Provision, ProvisionReason, ReapReason, Teardown, Wanted,
};
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus, ServiceStatus};
use crate::domain::status::{self, Failure, Outcomes, Publish};
use crate::ports::runtime::RuntimeError;
use crate::ports::store::{EventBatch, StoreError};
pub(crate) use crate::sched::Next;
use chrono::{DateTime, Utc};
use futures::future::join_all;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Why a reconcile failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    /// The state database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Docker failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A container could not be removed.
    #[error("teardown failed: {0}")]
    Teardown(String),
    /// One or more engines failed to provision (the status says which).
    #[error("provisioning failed: {0}")]
    Provision(String),
    /// This process does not lead (any more).
    #[error(transparent)]
    Fenced(#[from] super::Fenced),
    /// The reconcile did not finish within its deadline and was abandoned.
    #[error("the reconcile did not finish within {0:?} (--reconcile-timeout) and was abandoned; it is retried with backoff (if this repeats, look for a stuck Docker daemon or state database, or raise --reconcile-timeout)")]
    TimedOut(Duration),
}

impl From<super::ControllerError> for ReconcileError {
    fn from(e: super::ControllerError) -> Self {
        match e {
            super::ControllerError::Store(e) => ReconcileError::Store(e),
            super::ControllerError::Runtime(e) => ReconcileError::Runtime(e),
        }
    }
}

/// Converges one sandbox ([`converge`]) within `--reconcile-timeout` and
/// records what it did as events: the entry point of the work queue. Past
/// the deadline the reconcile is dropped where it waits (a container it created but did not publish is
/// replaced by the next one), counted, and reported as
/// [`ReconcileError::TimedOut`], so its worker slot is freed and the key
/// is retried with backoff. What it did until then is still recorded as
/// events.
pub(crate) async fn reconcile(ctx: &Context, id: &SandboxId) -> Result<Next, ReconcileError> {
    within(ctx, id, Some(ctx.env.config.reconcile_timeout)).await
}

/// [`reconcile`] without a deadline: the unit tests drive it on paused
/// time.
#[cfg(test)]
pub(crate) async fn reconcile_unbounded(
    ctx: &Context,
    id: &SandboxId,
) -> Result<Next, ReconcileError> {
    within(ctx, id, None).await
}

async fn within(
    ctx: &Context,
    id: &SandboxId,
    deadline: Option<Duration>,
) -> Result<Next, ReconcileError> {
    let mut journal = Journal::default();
    let converging = converge(ctx, id, &mut journal);
    let result = match deadline {
        None => converging.await,
        Some(after) => match tokio::time::timeout(after, converging).await {
            Ok(result) => result,
            Err(_) => {
                // The queue's handler logs it with the sandbox id.
                ctx.env.metrics.queue.timed_out();
                Err(ReconcileError::TimedOut(after))
            }
        },
    };
    if let Err(e) = &result {
        // Provisioning and teardown failures have their events already;
        // a store that fails or a fenced process cannot record any.
        if matches!(e, ReconcileError::Runtime(_) | ReconcileError::TimedOut(_)) {
            journal.push(Event::reconcile_failed(&e.to_string()));
        }
    }
    record(ctx, id, &mut journal).await;
    result
}

/// Writes the journal's events (scrubbed of every password it saw). A
/// failure is logged and counted, never the reconcile's: events say what
/// happened, they decide nothing.
async fn record(ctx: &Context, id: &SandboxId, journal: &mut Journal) {
    if journal.is_empty() {
        return;
    }
    let events = journal.take();
    let Ok(term) = ctx.env.fence.check() else {
        return;
    };
    let keep = ctx.env.config.events_per_sandbox;
    #[cfg(any(test, feature = "simulation"))]
    let keep = if crate::domain::mutation::on(crate::domain::mutation::Mutation::KeepEveryEvent) {
        u32::MAX
    } else {
        keep
    };
    let batch = EventBatch {
        sandbox: id,
        owner: journal.owner.as_deref().unwrap_or_default(),
        incarnation: journal.incarnation.as_ref(),
        events: &events,
        keep,
    };
    match ctx.env.store.record_events(batch, term).await {
        Ok(notices) => {
            ctx.env.metrics.events.recorded(&events);
            ctx.outbox.webhook.offer(notices);
        }
        Err(e) => {
            ctx.env.metrics.events.lost(events.len());
            tracing::warn!(error = %e, events = events.len(), "could not record events");
        }
    }
}

/// Converges one sandbox, noting in `journal` what it did: read both
/// sides, decide the plan, gate it, act on what the gates let through,
/// publish the status, then what follows it.
#[tracing::instrument(name = "reconcile", skip_all, fields(sandbox = %id))]
async fn converge(
    ctx: &Context,
    id: &SandboxId,
    journal: &mut Journal,
) -> Result<Next, ReconcileError> {
    let mut seen = read(ctx, id, journal).await?;
    let Decided { plan, freezing } = decide(ctx, id, &mut seen).await?;
    let Gated { mut plan, held } = gate(ctx, id, &seen, plan, journal).await?;
    if let Some(reaping) = held.reaping {
        return Ok(hold_reaping(ctx, id, &seen, reaping, journal));
    }
    let acted = act(ctx, id, &seen, &mut plan, &freezing, &held, journal).await?;
    let published = publish(ctx, id, &seen, &plan, held, acted, journal).await?;
    follow_up(&ctx.env, &seen, &plan, published, journal).await
}

/// What a reconcile read of one sandbox: both sides and what they are
/// judged by.
struct Seen<'c> {
    /// This state database.
    state: &'c StateId,
    /// The row, if it exists.
    desired: Option<DesiredSandbox>,
    /// The sandbox's containers that are this state database's.
    observed: Vec<ObservedContainer>,
    /// Another state database's containers of the sandbox: never touched.
    foreign: Vec<ObservedContainer>,
    /// The status of the row's incarnation.
    previous: Option<SandboxStatus>,
    /// How the row's owner container is doing, if it names one.
    owner: Option<OwnerState>,
    /// When the row was first seen missing (`None` while it exists).
    gone_since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
}

impl Seen<'_> {
    /// The row to converge to, unless it is gone, unwanted or unreadable.
    fn converging(&self, plan: &Plan) -> Option<&DesiredSandbox> {
        self.desired
            .as_ref()
            .filter(|d| plan.wanted == Wanted::Yes && d.invalid.is_none())
    }
}

/// Reads the row, the containers, the status and the owner container.
async fn read<'c>(
    ctx: &'c Context,
    id: &SandboxId,
    journal: &mut Journal,
) -> Result<Seen<'c>, ReconcileError> {
    let state = ctx.env.state_id().await?;
    let desired = ctx.env.store.fetch_desired(id).await?;
    let observed = containers::of_sandbox(&ctx.env, &ctx.sources.pool, id).await?;
    let previous = ctx.env.store.fetch_status(id).await?;
    // Another state database's containers are not this one's to touch:
    // left out of the plan (relists count and report them).
    let (observed, foreign) = identity::partition(observed, state, previous.as_ref());
    about(journal, desired.as_ref(), &observed, previous.as_ref());
    // A status of an earlier incarnation of the row vouches for nothing.
    let previous = status::of_incarnation(previous.as_ref(), desired.as_ref()).cloned();
    let owner = match desired
        .as_ref()
        .and_then(|d| Some((d, d.owner_container.as_deref()?)))
    {
        Some((d, name)) => Some(owner_state(&ctx.env, d, name).await?),
        None => None,
    };
    let now = ctx.env.clock.now();
    let gone_since = match &desired {
        Some(_) => {
            ctx.reaps.gone.forget(id);
            None
        }
        None => Some(ctx.reaps.gone.missing(id, now, !observed.is_empty())),
    };
    Ok(Seen {
        state,
        desired,
        observed,
        foreign,
        previous,
        owner,
        gone_since,
        now,
    })
}

/// The plan, and the pause step it implies.
struct Decided {
    plan: Plan,
    freezing: pause::Step,
}

/// Plans ([`plan::plan`]) and steps the pause ([`pause::step`]). Idle by
/// its requests and touches: a client connected to an engine about to be
/// frozen or released is a use, recorded in the row, and the plan is made
/// again from the row as it is now (its idleness starts again).
async fn decide(
    ctx: &Context,
    id: &SandboxId,
    seen: &mut Seen<'_>,
) -> Result<Decided, ReconcileError> {
    let policy = ctx.env.policy();
    let plan_for = |seen: &Seen<'_>| {
        plan::plan(
            seen.desired.as_ref(),
            &seen.observed,
            seen.previous.as_ref(),
            seen.owner,
            seen.gone_since,
            seen.now,
            &policy,
        )
    };
    let mut plan = plan_for(seen);
    let mut freezing = pause::step(&plan, &seen.observed);
    if (plan.wanted == Wanted::Idle || !freezing.freeze.is_empty())
        && super::pause::in_use(
            &ctx.env,
            &plan,
            &freezing,
            &seen.observed,
            seen.previous.as_ref(),
        )
        .await
    {
        if let Some(at) = super::pause::record_use(&ctx.env, id, seen.now).await? {
            if let Some(d) = seen.desired.as_mut() {
                d.last_used_at = at;
            }
        }
        plan = plan_for(seen);
        freezing = pause::step(&plan, &seen.observed);
    }
    if plan.teardowns().any(|t| t.reason == ReapReason::Superseded) {
        // The row was deleted and inserted again: the heals of the earlier
        // incarnation are not this one's.
        ctx.heals.crash_loops.forget(id);
    }
    Ok(Decided { plan, freezing })
}

/// Looks up what the gates need, in their order, and runs them
/// ([`gate::gate`]): what the row would create waits for its owner's
/// quota and the host's memory budget (all or nothing), a provision for
/// its image (fetched in the background, so no worker waits for a pull),
/// a heal for its crash-loop back-off, a provision for a container name
/// another state database holds, a deleted row's reap for the breaker.
async fn gate(
    ctx: &Context,
    id: &SandboxId,
    seen: &Seen<'_>,
    plan: Plan,
    journal: &mut Journal,
) -> Result<Gated, ReconcileError> {
    let admission = match seen.converging(&plan) {
        Some(d) => admission::ask(&ctx.env, &ctx.admission, d, &plan, journal).await?,
        None => {
            // Gone, unwanted or unreadable: it asks for nothing.
            admission::forget(&ctx.env, &ctx.admission, id);
            gate::Admission::Go
        }
    };
    let images = match &seen.desired {
        Some(d) => images_absent(ctx, d, gate::admitted(&plan, &admission)).await,
        None => BTreeMap::new(),
    };
    let causes = match &seen.desired {
        Some(d) => heal_causes(ctx, d, &plan).await,
        None => BTreeMap::new(),
    };
    let heals = match &seen.desired {
        Some(d) => plan
            .provisions()
            .filter(|p| p.reason == ProvisionReason::Heal)
            .map(|p| {
                (
                    p.engine,
                    ctx.heals.crash_loops.heals(&d.id, p.engine, d.generation),
                )
            })
            .collect(),
        None => BTreeMap::new(),
    };
    let reaping = match seen.gone_since.filter(|_| gate::reaps_deleted_row(&plan)) {
        Some(since) => match ctx.reaps.breaker.may_reap(id, since) {
            Ok(()) => Reaping::Go,
            Err(Held::Paused(_)) => Reaping::Paused,
            Err(Held::Unconfirmed) => Reaping::Unconfirmed,
        },
        None => Reaping::Go,
    };
    let facts = gate::Facts {
        admission,
        images,
        heals,
        causes,
        crash_loop: &ctx.env.config.crash_loop,
        now: seen.now,
        foreign: &seen.foreign,
        state: seen.state,
        reaping,
    };
    let gated = gate::gate(plan, &facts);
    if let Some(d) = &seen.desired {
        for engine in &gated.held.heals_due {
            let window = ctx.env.config.crash_loop.window;
            ctx.heals
                .crash_loops
                .record(&d.id, *engine, d.generation, seen.now, window);
        }
    }
    for (engine, gate) in &gated.held.crash_loops {
        tracing::info!(engine = %engine, gate = ?gate, "heal held back: its container keeps dying on its own (crash-loop back-off)");
    }
    let (actions, held) = (gated.plan.actions.len(), gated.held.crash_loops.len());
    tracing::debug!(actions, held, "planned");
    Ok(gated)
}

/// A deleted row's reap held back by the breaker: its containers stay
/// (and count against the host's budget), but it no longer counts against
/// its owner, so the rows waiting for that room go now, not after the
/// reap. When to look again: after the next relist if reaping is paused,
/// else in a second, once the relist asked for has looked.
fn hold_reaping(
    ctx: &Context,
    id: &SandboxId,
    seen: &Seen<'_>,
    reaping: Reaping,
    journal: &Journal,
) -> Next {
    let owner = journal.owner.as_deref().unwrap_or_default();
    let torn_down = Default::default();
    admission::settle(
        &ctx.env,
        &ctx.admission,
        id,
        admission::Holder {
            owner,
            wanted: None,
        },
        &seen.observed,
        &torn_down,
        [],
    );
    match reaping {
        Reaping::Unconfirmed => {
            ctx.relist_now.notify_one();
            Next::After(Duration::from_secs(1))
        }
        _ => {
            tracing::debug!("reap held back: reaping is paused");
            Next::After(ctx.env.config.relist_interval)
        }
    }
}

/// What acting did, for the status decision.
struct Acted {
    /// The network the sandbox is on.
    network: String,
    /// Each engine provisioned or promoted, or held by a name or its image.
    provisioned: Vec<(EngineName, Result<ServiceStatus, String>)>,
    /// The first teardown that failed.
    teardown: Option<String>,
    /// The containers the row names that could not be attached.
    attach: Vec<String>,
    /// Heals that failed, held back by the crash-loop back-off, and what
    /// failed.
    retries: Vec<(EngineName, HealGate, String)>,
    /// Whether the sandbox was frozen (see [`Outcomes::paused`]).
    paused: Option<Result<(), String>>,
    /// A pause waiting for a provision to finish looks again then.
    pause_at: Option<DateTime<Utc>>,
    /// The status the decision builds on: as read, or as a rotation's
    /// switch last wrote it.
    standing: Option<SandboxStatus>,
    /// The row changed since the status last observed it.
    new_request: bool,
}

/// Does what the gated plan says: thaws, tears down, puts the sandbox on
/// its network, provisions (a rotation publishes its new container at its
/// commit point), attaches, freezes, and removes what a sandbox without
/// containers leaves.
async fn act(
    ctx: &Context,
    id: &SandboxId,
    seen: &Seen<'_>,
    plan: &mut Plan,
    freezing: &pause::Step,
    held: &gate::Held,
    journal: &mut Journal,
) -> Result<Acted, ReconcileError> {
    let causes = &held.causes;
    // A paused sandbox in use again resumes first (the request waits for
    // it); a frozen container about to go is thawed to take its stop.
    super::pause::thaw(
        &ctx.env,
        &ctx.sources.forks,
        plan,
        freezing,
        &seen.observed,
        journal,
    )
    .await?;
    let teardown = teardown(&ctx.env, seen.desired.as_ref(), plan, journal).await;
    // Warm-pool containers for the provisions that may claim one, taken
    // now: a sandbox without a network yet adopts the first one's.
    let reserved = match seen.converging(plan) {
        Some(d) => pool::reserve(
            &ctx.env,
            &ctx.sources.pool,
            d,
            plan,
            adopts_pool_network(&ctx.env, seen, plan),
        ),
        None => pool::Reserved::none(&ctx.sources.pool),
    };
    let (network, commit) = place(ctx, id, seen, plan, causes, &reserved).await?;
    let new_request = seen
        .desired
        .as_ref()
        .is_some_and(|d| status::is_new_request(d, seen.previous.as_ref()));
    let mut provisioned = match seen.converging(plan) {
        Some(_) => promote_all(&ctx.env, id, &network, plan, journal).await,
        None => Vec::new(),
    };
    let mut interrupted = BTreeSet::new();
    if let Some(d) = &seen.desired {
        let run = Run {
            new_request,
            causes,
            commit: &commit,
            reserved: &reserved,
            interrupted: Default::default(),
        };
        provisioned.extend(provision_all(ctx, d, plan, &run, journal).await);
        interrupted = run.interrupted.into_inner().unwrap_or_default();
    }
    let retries = match &seen.desired {
        Some(d) => heals_back_off(ctx, d, plan, seen.now, &interrupted, &mut provisioned),
        None => Vec::new(),
    };
    drop(reserved);
    for (engine, why) in &held.names {
        journal.push(Event::not_provisioned(*engine, "name", why));
        provisioned.push((*engine, Err(why.clone())));
    }
    let standing = commit.published(seen.previous.clone()).await;
    for (engine, why) in &held.images_failed {
        journal.push(Event::not_provisioned(*engine, "image", why));
        provisioned.push((*engine, Err(why.clone())));
    }
    let attach = match seen.converging(plan) {
        Some(d) => network::sync_attached(&ctx.env, d, &network).await?,
        None => Vec::new(),
    };
    if !attach.is_empty() {
        journal.push(Event::attach_failed(&attach));
    }
    for (engine, gate) in &held.crash_loops {
        journal.push(Event::held(*engine, *gate));
    }
    // Idle and asked to pause: freeze once every engine is kept.
    let paused = match seen.converging(plan) {
        Some(_) => super::pause::freeze(&ctx.env, freezing, &seen.observed, journal).await,
        None => None,
    };
    // A pause waiting for a provision to finish looks again soon.
    let pause_at =
        (plan.pause && !freezing.paused).then(|| seen.now + chrono::Duration::seconds(5));
    if plan.wanted != Wanted::Yes && !plan.is_waiting() && teardown.is_none() {
        clean_up(ctx, id, seen, plan, &network).await?;
    }
    Ok(Acted {
        network,
        provisioned,
        teardown,
        attach,
        retries,
        paused,
        pause_at,
        standing,
        new_request,
    })
}

/// Whether the sandbox would take a reserved pool container's network as
/// its own: it has none recorded, keeps no container, and each sandbox
/// has a network of its own.
fn adopts_pool_network(env: &Env, seen: &Seen<'_>, plan: &Plan) -> bool {
    let recorded = seen.previous.as_ref().and_then(|p| p.network.as_deref());
    recorded.is_none()
        && plan.kept().next().is_none()
        && matches!(env.config.network, NetworkLayout::PerSandbox { .. })
}

/// Puts the sandbox on its network (the one its status records, else a
/// reserved pool container's, else a new one) and removes an earlier
/// incarnation's data volumes before a provision could mount them. The
/// status says what is being done while it is done: before the first
/// container is created it is written `provisioning` (or `healing`, with
/// the cause), so a create that hangs is seen as such; [`publish`] writes
/// the outcome. Returns the network and the [`Commit`] a rotation's switch
/// publishes through, starting from that status.
async fn place(
    ctx: &Context,
    id: &SandboxId,
    seen: &Seen<'_>,
    plan: &mut Plan,
    causes: &BTreeMap<EngineName, HealCause>,
    reserved: &pool::Reserved<'_>,
) -> Result<(String, Commit), ReconcileError> {
    let recorded = seen.previous.as_ref().and_then(|p| p.network.as_deref());
    let adopted = adopts_pool_network(&ctx.env, seen, plan)
        .then(|| reserved.network())
        .flatten();
    let network = match &adopted {
        Some(n) => n.clone(),
        None => network::sandbox_network(&ctx.env, id, recorded),
    };
    let desired = seen.desired.as_ref();
    let failures: BTreeMap<EngineName, String> = plan
        .provisions()
        .filter(|p| p.reason == ProvisionReason::Heal)
        .filter_map(|p| {
            Some((
                p.engine,
                ctx.heals.crash_loops.last_heal_failure(id, p.engine)?,
            ))
        })
        .collect();
    let mut update = status::while_provisioning(plan, desired, seen.previous.as_ref(), causes)
        .map(|u| status::with_last_failures(u, &failures));
    if let Some(update) = &mut update {
        update.network = Some(network.clone());
        write_status(ctx, id, update).await?;
    }
    if let Some(d) = seen.converging(plan) {
        if adopted.is_none() {
            network::ensure(&ctx.env, id, &network, &seen.observed, plan).await?;
        } else if let Some(me) = &ctx.env.config.controller_container {
            // The adopted network exists (its pool container is on it):
            // only sandboxd's own container may need to join it.
            ctx.env.runtime.connect(&network, me).await?;
        }
        if (d.persistent || d.fork_of.is_some()) && plan.provisions().next().is_some() {
            // Never mount an earlier incarnation's data (or fork copy).
            volume::remove_superseded(&ctx.env, d, seen.state).await?;
        }
    }
    let commit = Commit::new(id.clone(), network.clone(), update);
    Ok((network, commit))
}

/// No container of the sandbox is left: its network goes too, and once
/// the row is deleted and its grace has passed since it was seen gone,
/// the data of a persistent one. Another state database's containers on
/// them keep both.
async fn clean_up(
    ctx: &Context,
    id: &SandboxId,
    seen: &Seen<'_>,
    plan: &Plan,
    network: &str,
) -> Result<(), ReconcileError> {
    if !seen.foreign.is_empty() {
        tracing::debug!(
            foreign = seen.foreign.len(),
            "another state database's containers use the sandbox's network and volumes: left alone"
        );
        return Ok(());
    }
    network::remove(&ctx.env, network, seen.state).await?;
    if plan.wanted == Wanted::Deleted && plan.data_kept_until.is_none() {
        volume::remove_all(&ctx.env, id, seen.state).await?;
        ctx.reaps.gone.forget(id);
        ctx.heals.crash_loops.forget(id);
    }
    Ok(())
}

/// What publishing left, for what follows it.
struct Published {
    verdict: status::Verdict,
    /// The status the decision built on.
    standing: Option<SandboxStatus>,
    /// When to look again for a held heal, or a pause waiting.
    look_at: Option<DateTime<Utc>>,
}

/// Decides the status from what acting did ([`status::decide`]; a row
/// waiting for admission says so), writes it, deletes it or leaves it,
/// then settles what the sandbox holds in the admission ledger: the
/// engines it did not tear down and, while its row is wanted, those it
/// publishes or was admitted to create.
async fn publish(
    ctx: &Context,
    id: &SandboxId,
    seen: &Seen<'_>,
    plan: &Plan,
    held: gate::Held,
    acted: Acted,
    journal: &Journal,
) -> Result<Published, ReconcileError> {
    let mut held = held;
    let mut heal_failures = BTreeMap::new();
    for (engine, gate, failure) in acted.retries {
        held.crash_loops.push((engine, gate));
        heal_failures.insert(engine, failure);
    }
    // A heal the back-off still holds failed in an earlier reconcile: its
    // status keeps saying why until the next try.
    for (engine, _) in &held.crash_loops {
        if !heal_failures.contains_key(engine) {
            if let Some(failure) = ctx.heals.crash_loops.last_heal_failure(id, *engine) {
                heal_failures.insert(*engine, failure);
            }
        }
    }
    let heal_at = held.crash_loops.iter().map(|(_, gate)| match gate {
        HealGate::At { at, .. } => *at,
        // An interrupted heal goes again at once.
        HealGate::Now => seen.now,
    });
    let look_at = heal_at.chain(acted.pause_at).min();
    let waiting_for_images = !held.awaiting.is_empty();
    let outcomes = Outcomes {
        provisioned: acted.provisioned,
        teardown: acted.teardown.clone(),
        attach: acted.attach,
        held: held.crash_loops,
        heal_failures,
        awaiting: held.awaiting,
        paused: acted.paused,
    };
    let standing = acted.standing;
    let desired = seen.desired.as_ref();
    let mut verdict = status::decide(plan, desired, standing.as_ref(), &outcomes);
    if let Publish::Write(update) = &mut verdict.publish {
        update.network = Some(acted.network);
        if let Some(message) = &held.admission {
            let observed = status::observed_generation(standing.as_ref());
            crate::domain::admission::waiting_status(update, observed, message);
        }
    }
    match &verdict.publish {
        Publish::Write(update) => write_status(ctx, id, update).await?,
        Publish::Delete => {
            ctx.env.store.delete_status(id, ctx.env.term()?).await?;
            ctx.outbox.phases.published(id, None, &ctx.env.metrics);
        }
        Publish::Nothing => {}
    }
    let torn_down = match &acted.teardown {
        None => plan.teardowns().map(|t| &t.container).collect(),
        // Which one failed is not known: every container still counts.
        Some(_) => std::collections::HashSet::new(),
    };
    let mut published: Vec<String> = match &verdict.publish {
        Publish::Write(update) => update.services.keys().cloned().collect(),
        Publish::Delete => Vec::new(),
        Publish::Nothing => standing
            .as_ref()
            .map(|p| p.services.keys().cloned().collect())
            .unwrap_or_default(),
    };
    published.extend(held.admitted);
    let owner = journal.owner.as_deref().unwrap_or_default();
    let wanted = plan.wanted == Wanted::Yes;
    admission::settle(
        &ctx.env,
        &ctx.admission,
        id,
        admission::Holder {
            owner,
            wanted: desired.filter(|_| wanted).map(|d| d.incarnation.as_ref()),
        },
        &seen.observed,
        &torn_down,
        published,
    );
    if let Some(d) = desired
        .filter(|_| acted.new_request && wanted && !waiting_for_images && held.admission.is_none())
    {
        ctx.env
            .metrics
            .lifecycle
            .generation_lag(ctx.env.seconds_since(d.updated_at));
    }
    Ok(Published {
        verdict,
        standing,
        look_at,
    })
}

/// What follows the status: the checkpoints and resets asked for
/// (`sandbox_checkpoint`, `sandbox_reset`), run once the sandbox is ready
/// and this reconcile changed nothing, and when to look again.
async fn follow_up(
    env: &Env,
    seen: &Seen<'_>,
    plan: &Plan,
    published: Published,
    journal: &mut Journal,
) -> Result<Next, ReconcileError> {
    let Published {
        verdict,
        standing,
        look_at,
    } = published;
    let steady = plan.provisions().next().is_none()
        && plan.teardowns().next().is_none()
        && plan.promotions().next().is_none();
    // The status as this reconcile left it: written, or kept.
    let status_now = match &verdict.publish {
        Publish::Write(u) => Some(checkpoint::Published {
            phase: u.phase,
            message: &u.message,
            services: &u.services,
        }),
        Publish::Delete => None,
        Publish::Nothing => standing.as_ref().map(|p| checkpoint::Published {
            phase: p.phase,
            message: &p.message,
            services: &p.services,
        }),
    };
    let checkpoints_waiting = match seen.converging(plan).filter(|_| verdict.failure.is_none()) {
        Some(d) => checkpoint::perform(env, d, status_now, &seen.observed, steady, journal).await?,
        None => false,
    };
    let checkpoint_look = checkpoints_waiting.then(|| seen.now + chrono::Duration::seconds(1));
    match verdict.failure {
        None => Ok(
            match plan
                .next_look()
                .into_iter()
                .chain(look_at)
                .chain(checkpoint_look)
                .min()
            {
                Some(until) => Next::After((until - seen.now).to_std().unwrap_or_default()),
                None => Next::Idle,
            },
        ),
        Some(Failure::Teardown(e)) => Err(ReconcileError::Teardown(e)),
        Some(Failure::Provision(message)) => Err(ReconcileError::Provision(message)),
    }
}

/// The engines among `provisions` whose image is absent: each fetch runs
/// in the background (started here or joined) and wakes the sandbox when
/// it ends, so no worker slot waits for a pull or a build.
async fn images_absent<'p>(
    ctx: &Context,
    desired: &DesiredSandbox,
    provisions: impl Iterator<Item = &'p Provision>,
) -> BTreeMap<EngineName, gate::Image> {
    let mut absent = BTreeMap::new();
    for p in provisions {
        // An engine this binary lacks is reported by provisioning.
        let Some(engine) = ctx.env.engines.get(p.engine) else {
            continue;
        };
        let image = ctx
            .env
            .config
            .images
            .image_for(engine, !p.features.is_empty());
        match ctx.sources.images.need(&image, &desired.id).await {
            Availability::Go => {}
            Availability::Fetching(why) => {
                absent.insert(p.engine, gate::Image::Fetching(why));
            }
            Availability::Failed(why) => {
                absent.insert(p.engine, gate::Image::Failed(why));
            }
        }
    }
    absent
}

/// What the provisions of one reconcile share.
struct Run<'r, 'c> {
    /// The row changed since the status last observed it.
    new_request: bool,
    /// Why each healed engine needs it.
    causes: &'r BTreeMap<EngineName, HealCause>,
    /// What rotations publish through.
    commit: &'r Commit,
    /// The warm-pool containers reserved for them.
    reserved: &'r pool::Reserved<'c>,
    /// Heals whose new container was ended from outside before it was
    /// ready (filled in by the provisions).
    interrupted: std::sync::Mutex<BTreeSet<EngineName>>,
}

/// Provisions every engine the plan creates, at once, noting each in
/// `journal`.
async fn provision_all(
    ctx: &Context,
    desired: &DesiredSandbox,
    plan: &Plan,
    run: &Run<'_, '_>,
    journal: &mut Journal,
) -> Vec<(EngineName, Result<ServiceStatus, String>)> {
    let done = join_all(plan.provisions().map(|p| async move {
        let cause = run.causes.get(&p.engine).copied();
        let result = provision::provision(
            ctx,
            desired,
            p,
            run.new_request,
            cause,
            run.commit,
            run.reserved,
        )
        .await;
        // A heal whose new container was killed, stopped or removed from
        // outside before it was ready was interrupted, not crashed.
        let interrupted = p.reason == ProvisionReason::Heal
            && result
                .as_ref()
                .err()
                .is_some_and(super::provision::ProvisionError::is_interrupted);
        if interrupted {
            run.interrupted.lock().unwrap().insert(p.engine);
        }
        (p, result.map_err(|e| e.to_string()))
    }))
    .await;
    let mut provisioned = Vec::with_capacity(done.len());
    for (p, result) in done {
        let cause = run.causes.get(&p.engine).copied();
        provisioned.push(match result {
            Ok(done) => {
                journal.saw_service(&done.status);
                journal.push(Event::provisioned(
                    p,
                    cause,
                    event::Done {
                        status: &done.status,
                        origin: done.origin,
                        elapsed: done.elapsed,
                        data_kept: desired.persistent,
                    },
                ));
                if let Some(seeded) = Event::seeded(p, done.origin, done.seed_file) {
                    journal.push(seeded);
                }
                let source = desired.fork_of.as_ref().map(|f| &f.sandbox);
                if let Some(forked) = source.and_then(|s| Event::forked(p, done.origin, s)) {
                    journal.push(forked);
                }
                (p.engine, Ok(done.status))
            }
            Err(e) => {
                journal.push(Event::provision_failed(p, cause, &e));
                (p.engine, Err(e))
            }
        });
    }
    provisioned
}

/// Finishes the switches to rotations' new containers that were published
/// before the controller stopped (the old containers went as duplicates),
/// noting each in `journal`.
async fn promote_all(
    env: &Env,
    id: &SandboxId,
    network: &str,
    plan: &Plan,
    journal: &mut Journal,
) -> Vec<(EngineName, Result<ServiceStatus, String>)> {
    let promoted = join_all(plan.promotions().map(|(engine, container, status)| async move {
        tracing::info!(%engine, %container, "finishing the switch to a rotation's published new container");
        let result =
            rotation::promote(env, id, network, engine, container, None, status.clone()).await;
        (engine, result.map_err(|e| e.to_string()))
    }))
    .await;
    for (engine, result) in &promoted {
        journal.push(Event::promoted(
            *engine,
            result.as_ref().err().map(String::as_str),
        ));
    }
    promoted
}

/// Tells `journal` whose sandbox this is (the row's owner and incarnation,
/// or what its containers' labels and status say once the row is gone) and
/// every password the status holds.
fn about(
    journal: &mut Journal,
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    previous: Option<&SandboxStatus>,
) {
    if let Some(status) = previous {
        journal.saw(status);
    }
    let labelled = observed.first().map(|c| &c.labels);
    journal.owner = desired
        .map(|d| d.owner.clone())
        .or_else(|| labelled.map(|l| l.owner.clone()));
    journal.incarnation = desired
        .and_then(|d| d.incarnation.clone())
        .or_else(|| {
            labelled.and_then(|l| {
                l.incarnation
                    .as_deref()
                    .and_then(|i| Incarnation::parse(i).ok())
            })
        })
        .or_else(|| previous.and_then(|s| s.incarnation.clone()));
}

/// How the row's owner container `name` is doing. Only a container opted
/// in for the row's owner counts, as for `attach` ([`attach::opted_in`]):
/// any other name is as missing as one no container has (the same grace,
/// the same release and message), so whether a sandbox is released tells
/// its tenant nothing of what else runs on the host.
async fn owner_state(
    env: &Env,
    desired: &DesiredSandbox,
    name: &str,
) -> Result<OwnerState, ReconcileError> {
    let found = env.runtime.attach_candidate(name).await?;
    let owner = match attach::opted_in(name, &desired.owner, found.as_ref()) {
        Ok(owner) => owner,
        Err(refusal) => {
            tracing::debug!(
                sandbox = %desired.id,
                owner = desired.owner,
                container = name,
                reason = refusal.as_str(),
                why = refusal.phrase(),
                "the owner container does not count: judged missing"
            );
            return Ok(OwnerState::Missing);
        }
    };
    // By its full id: the container judged is the container looked at.
    Ok(match env.runtime.inspect(&owner.id).await? {
        None => OwnerState::Missing,
        Some(run) if run.running => OwnerState::Running,
        Some(run) => OwnerState::Exited(run.finished_at),
    })
}

/// Why each engine the plan heals needs it (`domain::death`): an order
/// from outside the event stream reported, else how its container ended.
/// Looked up before the gates, so that only the engine's own deaths back
/// off, and before the status says `healing`, so that it can say why.
async fn heal_causes(
    ctx: &Context,
    desired: &DesiredSandbox,
    plan: &Plan,
) -> BTreeMap<EngineName, HealCause> {
    let heals = plan
        .provisions()
        .filter(|p| p.reason == ProvisionReason::Heal)
        .map(|p| async move {
            let retrying = ctx
                .heals.crash_loops
                .last_heal_failure(&desired.id, p.engine)
                .is_some();
            let cause = match p.replace.first() {
                Some(dead) => {
                    let order = ctx.env.orders.of(dead);
                    // An inspect that fails says nothing: judged as ended.
                    let ended = ctx.env.runtime.inspect(dead).await.unwrap_or_else(|e| {
                        tracing::debug!(container = %dead, error = %e, "could not inspect the dead container");
                        Some(RunState::default())
                    });
                    death::cause(order, ended.as_ref(), retrying)
                }
                None => death::cause(None, None, retrying),
            };
            (p.engine, cause)
        });
    join_all(heals).await.into_iter().collect()
}

/// Heals that failed to come up are retried under the crash-loop back-off
/// rather than failing the reconcile: the sandbox stays `healing`, with
/// its credentials, and says when the next try is (a heal never ends in
/// `failed`). Each failure counts as the engine's own death (a heal of an
/// order from outside was not counted when it went); one that came up
/// clears the engine's record of failing. A heal `interrupted` from outside
/// (its new container killed before it was ready) is no death of the
/// engine's: it goes again at once. Returns each held engine with its gate
/// and what failed, taking their failures out of `provisioned`.
fn heals_back_off(
    ctx: &Context,
    desired: &DesiredSandbox,
    plan: &Plan,
    now: DateTime<Utc>,
    interrupted: &BTreeSet<EngineName>,
    provisioned: &mut Vec<(EngineName, Result<ServiceStatus, String>)>,
) -> Vec<(EngineName, HealGate, String)> {
    let policy = &ctx.env.config.crash_loop;
    let mut held = Vec::new();
    provisioned.retain(|(engine, result)| {
        let Some(p) = plan
            .provisions()
            .find(|p| p.engine == *engine && p.reason == ProvisionReason::Heal)
        else {
            return true;
        };
        let Err(e) = result else {
            ctx.heals.crash_loops.heal_done(&desired.id, *engine, None);
            for dead in &p.replace {
                ctx.env.orders.forget(dead);
            }
            return true;
        };
        if interrupted.contains(engine) {
            tracing::info!(engine = %engine, error = %e, "heal interrupted from outside; healing again at once");
            held.push((*engine, HealGate::Now, e.clone()));
            return false;
        }
        let recorded = ctx.heals.crash_loops.heals(&desired.id, *engine, desired.generation);
        if !recorded.contains(&now) {
            ctx.heals.crash_loops
                .record(&desired.id, *engine, desired.generation, now, policy.window);
        }
        ctx.heals.crash_loops.heal_done(&desired.id, *engine, Some(e));
        let heals = ctx.heals.crash_loops.heals(&desired.id, *engine, desired.generation);
        match crash_loop::gate(&heals, now, policy) {
            HealGate::Now => true,
            gate => {
                tracing::warn!(engine = %engine, error = %e, gate = ?gate, "heal failed; retrying under the crash-loop back-off");
                held.push((*engine, gate, e.clone()));
                false
            }
        }
    });
    held
}

/// Runs every due teardown; all are attempted even if one fails, and each
/// is noted in `journal`. Returns the first failure. A teardown the row
/// justified (`desired`, as read: it wants the container no longer) goes
/// only if the row is still that row ([`recheck`]); otherwise it is left
/// to the next reconcile, which the change queued.
async fn teardown(
    env: &Env,
    desired: Option<&DesiredSandbox>,
    plan: &Plan,
    journal: &mut Journal,
) -> Option<String> {
    let mut first_error = None;
    let by_row = |t: &Teardown| desired.is_some() && t.reason != ReapReason::Duplicate;
    let changed = match desired {
        Some(d) if plan.teardowns().any(by_row) => match recheck::since(env, d).await {
            Ok(None) => None,
            Ok(Some(changed)) => Some(format!(
                "the row was {} since it was read: the containers it no longer wanted are left to the next reconcile",
                changed.as_str()
            )),
            Err(e) => Some(format!(
                "reading the row again before tearing down what it no longer wants failed ({e}): nothing was torn down; the next reconcile tries again"
            )),
        },
        _ => None,
    };
    for t in plan.teardowns() {
        if let (true, Some(why)) = (by_row(t), &changed) {
            tracing::info!(container = %t.container, reason = t.reason.as_str(), "{why}");
            first_error.get_or_insert(why.clone());
            continue;
        }
        let result = env
            .runtime
            .remove(&t.container, env.config.stop_timeout)
            .await;
        journal.push(Event::reaped(
            t,
            result.as_ref().err().map(ToString::to_string).as_deref(),
        ));
        match result {
            Ok(()) => {
                env.metrics.lifecycle.reaped(t.reason);
                tracing::info!(
                    container = %t.container,
                    engine = t.engine.as_str(),
                    reason = t.reason.as_str(),
                    "container torn down"
                );
            }
            Err(e) => {
                env.metrics.lifecycle.teardown_failed();
                tracing::warn!(container = %t.container, error = %e, "teardown failed; will retry");
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    first_error
}

/// Writes `update` as `id`'s status in this process's term and moves the
/// fleet's phase gauges with it (they count every write made here).
async fn write_status(
    ctx: &Context,
    id: &SandboxId,
    update: &status::StatusUpdate,
) -> Result<(), ReconcileError> {
    let env = &ctx.env;
    env.store.write_status(id, update, env.term()?).await?;
    (ctx.outbox.phases).published(id, Some(update.phase), &env.metrics);
    Ok(())
}
