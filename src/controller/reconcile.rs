//! `reconcile(id)`: read both sides for one sandbox, plan, act, publish.
//! Level-triggered: it never trusts what woke it. Every decision is made by
//! the pure core ([`plan`](crate::domain::plan) and
//! [`status`](crate::domain::status)); this module only does what they say.

use super::breaker::Held;
use super::image::Availability;
use super::provision::Provisioned;
use super::rotation::{self, Commit};
use super::Context;
use super::{admission, checkpoint, network, pool, provision, volume};
use crate::config::NetworkLayout;
use crate::domain::container::ObservedContainer;
use crate::domain::crash_loop::{self, HealGate};
use crate::domain::event::{self, Event, Journal};
use crate::domain::id::{ContainerId, EngineName, SandboxId};
use crate::domain::identity;
use crate::domain::identity::Incarnation;
use crate::domain::pause;
use crate::domain::plan::{
    self, Action, HealCause, OwnerState, Plan, Provision, ProvisionReason, ReapReason, Wanted,
};
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus, ServiceStatus};
use crate::domain::status::{self, Failure, Outcomes, Publish};
use crate::ports::runtime::RuntimeError;
use crate::ports::store::{EventBatch, StoreError};
pub(crate) use crate::sched::Next;
use futures::future::join_all;
use std::collections::BTreeMap;
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

/// [`reconcile`] within `--reconcile-timeout`: past it the reconcile is
/// dropped where it waits (a container it created but did not publish is
/// replaced by the next one), counted, and reported as
/// [`ReconcileError::TimedOut`], so its worker slot is freed and the key
/// is retried with backoff. What it did until then is still recorded as
/// events.
pub(crate) async fn bounded(ctx: &Context, id: &SandboxId) -> Result<Next, ReconcileError> {
    within(ctx, id, Some(ctx.config.reconcile_timeout)).await
}

/// Converges one sandbox ([`converge`]) and records what it did as events
/// (without a deadline: the unit tests drive it).
#[cfg(test)]
pub(crate) async fn reconcile(ctx: &Context, id: &SandboxId) -> Result<Next, ReconcileError> {
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
                ctx.metrics.reconcile_timed_out();
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
    let Ok(term) = ctx.fence.check() else {
        return;
    };
    let batch = EventBatch {
        sandbox: id,
        owner: journal.owner.as_deref().unwrap_or_default(),
        incarnation: journal.incarnation.as_ref(),
        events: &events,
        keep: ctx.config.events_per_sandbox,
    };
    match ctx.store.record_events(batch, term).await {
        Ok(notices) => {
            ctx.metrics.events_recorded(&events);
            ctx.webhook.offer(notices);
        }
        Err(e) => {
            ctx.metrics.events_lost(events.len());
            tracing::warn!(error = %e, events = events.len(), "could not record events");
        }
    }
}

/// Converges one sandbox: read → plan → act → publish, noting in
/// `journal` what it did.
#[tracing::instrument(name = "reconcile", skip_all, fields(sandbox = %id))]
async fn converge(
    ctx: &Context,
    id: &SandboxId,
    journal: &mut Journal,
) -> Result<Next, ReconcileError> {
    let state = ctx.state_id().await?;
    let mut desired = ctx.store.fetch_desired(id).await?;
    let mut observed = ctx.runtime.list(&ctx.config.deployment, Some(id)).await?;
    // Claimed warm-pool containers carry no sandbox label: their claims
    // say whose they are.
    observed.extend(super::pool::observed_of(ctx, id).await?);
    let previous = ctx.store.fetch_status(id).await?;
    // Another state database's containers are not this one's to touch:
    // left out of the plan (relists count and report them).
    let (observed, foreign) = identity::partition(observed, state, previous.as_ref());
    about(journal, desired.as_ref(), &observed, previous.as_ref());
    // A status of an earlier incarnation of the row vouches for nothing.
    let previous = status::of_incarnation(previous.as_ref(), desired.as_ref()).cloned();
    let owner = match desired.as_ref().and_then(|d| d.owner_container.as_deref()) {
        Some(name) => Some(owner_state(ctx, name).await?),
        None => None,
    };
    let now = ctx.clock.now();
    let gone_since = match &desired {
        Some(_) => {
            ctx.gone.forget(id);
            None
        }
        None => Some(ctx.gone.missing(id, now)),
    };

    let plan_for = |desired: Option<&DesiredSandbox>| {
        plan::plan(
            desired,
            &observed,
            previous.as_ref(),
            owner,
            gone_since,
            now,
            &ctx.config.policy(),
        )
    };
    let mut plan = plan_for(desired.as_ref());
    let mut freezing = pause::step(&plan, &observed);
    // Idle by its requests and touches: a client connected to an engine
    // about to be frozen or released is a use, recorded in the row, and
    // the sandbox's idleness starts again.
    if (plan.wanted == Wanted::Idle || !freezing.freeze.is_empty())
        && super::pause::in_use(ctx, &plan, &freezing, &observed, previous.as_ref()).await
    {
        if let Some(at) = super::pause::record_use(ctx, id, now).await? {
            if let Some(d) = desired.as_mut() {
                d.last_used_at = at;
            }
        }
        plan = plan_for(desired.as_ref());
        freezing = pause::step(&plan, &observed);
    }
    if plan.teardowns().any(|t| t.reason == ReapReason::Superseded) {
        // The row was deleted and inserted again: the heals of the earlier
        // incarnation are not this one's.
        ctx.crash_loops.forget(id);
    }
    // What the row would create waits for its owner's quota and the
    // host's memory budget, all or nothing.
    let admission_wait = match desired
        .as_ref()
        .filter(|d| plan.wanted == Wanted::Yes && d.invalid.is_none())
    {
        Some(d) => admission::admit(ctx, d, &mut plan, journal).await?,
        None => {
            // Gone, unwanted or unreadable: it asks for nothing.
            admission::forget(ctx, id);
            None
        }
    };
    // What was admitted stays held while the row wants it, created or
    // not yet (its image being fetched, or its provision failed and
    // retried): a row admitted earlier keeps its place.
    let admitted: Vec<String> = plan
        .provisions()
        .filter(|p| p.reason == ProvisionReason::Create)
        .map(|p| p.engine.as_str().to_owned())
        .collect();
    let (awaiting, image_failures) = match &desired {
        Some(d) => await_images(ctx, d, &mut plan).await,
        None => Default::default(),
    };
    let held = match &desired {
        Some(d) => hold_crash_loops(ctx, d, &mut plan, now),
        None => Vec::new(),
    };
    let names_held = identity::hold_names_held_by_foreign(&mut plan, &foreign, state);
    tracing::debug!(actions = plan.actions.len(), held = held.len(), "planned");
    if let Some(held) = hold_reaping(ctx, id, &plan, gone_since) {
        // Its containers stay (and count against the host's budget), but
        // a deleted row no longer counts against its owner: the rows
        // waiting for that room go now, not after the reap.
        admission::settle(
            ctx,
            id,
            journal.owner.as_deref().unwrap_or_default(),
            false,
            &observed,
            &Default::default(),
            [],
        );
        return Ok(held);
    }
    let causes = heal_causes(ctx, &plan).await;

    // A paused sandbox in use again resumes first (the request waits for
    // it); a frozen container about to go is thawed to take its stop.
    super::pause::thaw(ctx, &plan, &freezing, &observed, journal).await?;
    let teardown = teardown(ctx, &plan, journal).await;
    // The row to converge to, unless it is gone, expired or unreadable.
    let converging = desired
        .as_ref()
        .filter(|d| plan.wanted == Wanted::Yes && d.invalid.is_none());
    // Warm-pool containers for the provisions that may claim one, taken
    // now: a sandbox without a network yet adopts the first one's.
    let reserved = match converging {
        Some(d) => pool::reserve(ctx, d, &plan),
        None => pool::Reserved::none(&ctx.pool),
    };
    let recorded = previous.as_ref().and_then(|p| p.network.as_deref());
    let adopted = match (recorded, plan.kept().next(), &ctx.config.network) {
        (None, None, NetworkLayout::PerSandbox { .. }) => reserved.network(),
        _ => None,
    };
    let network = match &adopted {
        Some(n) => n.clone(),
        None => network::sandbox_network(ctx, id, recorded),
    };
    let network_name = Some(network.clone());
    let mut update =
        status::while_provisioning(&plan, desired.as_ref(), previous.as_ref(), &causes);
    if let Some(update) = &mut update {
        update.network.clone_from(&network_name);
        ctx.store.write_status(id, update, ctx.term()?).await?;
        ctx.phases.published(id, Some(update.phase), &ctx.metrics);
    }
    if let Some(d) = converging {
        if adopted.is_none() {
            network::ensure(ctx, id, &network, &observed, &mut plan).await?;
        } else if let Some(me) = &ctx.config.controller_container {
            // The adopted network exists (its pool container is on it):
            // only sandboxd's own container may need to join it.
            ctx.runtime.connect(&network, me).await?;
        }
        if d.persistent && plan.provisions().next().is_some() {
            // Never mount an earlier incarnation's data.
            volume::remove_superseded(ctx, d, state).await?;
        }
    }
    let new_request = desired
        .as_ref()
        .is_some_and(|d| status::is_new_request(d, previous.as_ref()));
    // Rotations publish their new containers through `commit` before the
    // old ones go; the decision below builds on what it wrote last.
    let commit = Commit::new(id.clone(), network.clone(), update);
    let mut provisioned = match converging {
        Some(_) => promote_all(ctx, id, &network, &plan).await,
        None => Vec::new(),
    };
    for (engine, result) in &provisioned {
        journal.push(Event::promoted(
            *engine,
            result.as_ref().err().map(String::as_str),
        ));
    }
    if let Some(d) = &desired {
        let done = provision_all(ctx, d, &plan, new_request, &causes, &commit, &reserved).await;
        for (p, result) in done {
            let cause = causes.get(&p.engine).copied();
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
                            data_kept: d.persistent,
                        },
                    ));
                    (p.engine, Ok(done.status))
                }
                Err(e) => {
                    journal.push(Event::provision_failed(p, cause, &e));
                    (p.engine, Err(e))
                }
            });
        }
    }
    drop(reserved);
    for (engine, why) in &names_held {
        journal.push(Event::not_provisioned(*engine, "name", why));
    }
    provisioned.extend(
        names_held
            .into_iter()
            .map(|(engine, why)| (engine, Err(why))),
    );
    let previous = commit.published(previous).await;
    for (engine, result) in &image_failures {
        if let Err(why) = result {
            journal.push(Event::not_provisioned(*engine, "image", why));
        }
    }
    provisioned.extend(image_failures);
    let attach = match converging {
        Some(d) => network::sync_attached(ctx, d, &network).await?,
        None => Vec::new(),
    };
    if !attach.is_empty() {
        journal.push(Event::attach_failed(&attach));
    }
    for (engine, gate) in &held {
        journal.push(Event::held(*engine, *gate));
    }
    // Idle and asked to pause: freeze once every engine is kept.
    let paused = match converging {
        Some(_) => super::pause::freeze(ctx, &freezing, &observed, journal).await,
        None => None,
    };
    // A pause waiting for a provision to finish looks again soon.
    let pause_at = (plan.pause && !freezing.paused).then(|| now + chrono::Duration::seconds(5));
    if plan.wanted != Wanted::Yes && !plan.is_waiting() && teardown.is_none() {
        if foreign.is_empty() {
            // No container of the sandbox is left: its network goes too,
            // and once the row is deleted and its grace has passed since
            // it was seen gone, the data of a persistent one.
            network::remove(ctx, &network, state).await?;
            if plan.wanted == Wanted::Deleted && plan.data_kept_until.is_none() {
                volume::remove_all(ctx, id, state).await?;
                ctx.gone.forget(id);
                ctx.crash_loops.forget(id);
            }
        } else {
            tracing::debug!(
                foreign = foreign.len(),
                "another state database's containers use the sandbox's network and volumes: left alone"
            );
        }
    }

    let heal_at = held
        .iter()
        .filter_map(|(_, gate)| match gate {
            HealGate::At(at) => Some(*at),
            _ => None,
        })
        .min();
    let waiting_for_images = !awaiting.is_empty();
    let outcomes_teardown = teardown.clone();
    let outcomes = Outcomes {
        provisioned,
        teardown,
        attach,
        held,
        awaiting,
        paused,
    };
    let mut verdict = status::decide(&plan, desired.as_ref(), previous.as_ref(), &outcomes);
    if let Publish::Write(update) = &mut verdict.publish {
        update.network = network_name;
        if let Some(message) = &admission_wait {
            crate::domain::admission::waiting_status(
                update,
                status::observed_generation(previous.as_ref()),
                message,
            );
        }
    }
    match &verdict.publish {
        Publish::Write(update) => {
            ctx.store.write_status(id, update, ctx.term()?).await?;
            ctx.phases.published(id, Some(update.phase), &ctx.metrics);
        }
        Publish::Delete => {
            ctx.store.delete_status(id, ctx.term()?).await?;
            ctx.phases.published(id, None, &ctx.metrics);
        }
        Publish::Nothing => {}
    }
    let torn_down = match &outcomes_teardown {
        None => plan.teardowns().map(|t| &t.container).collect(),
        // Which one failed is not known: every container still counts.
        Some(_) => std::collections::HashSet::new(),
    };
    let mut published: Vec<String> = match &verdict.publish {
        Publish::Write(update) => update.services.keys().cloned().collect(),
        Publish::Delete => Vec::new(),
        Publish::Nothing => previous
            .as_ref()
            .map(|p| p.services.keys().cloned().collect())
            .unwrap_or_default(),
    };
    published.extend(admitted);
    admission::settle(
        ctx,
        id,
        journal.owner.as_deref().unwrap_or_default(),
        plan.wanted == Wanted::Yes,
        &observed,
        &torn_down,
        published,
    );
    if let Some(d) = desired.as_ref().filter(|_| {
        new_request && plan.wanted == Wanted::Yes && !waiting_for_images && admission_wait.is_none()
    }) {
        ctx.metrics.generation_lag(ctx.seconds_since(d.updated_at));
    }
    // Checkpoints and resets asked for (sandbox_checkpoint, sandbox_reset)
    // run once the sandbox is ready and this reconcile changed nothing.
    let steady = plan.provisions().next().is_none()
        && plan.teardowns().next().is_none()
        && plan.promotions().next().is_none();
    // The status as this reconcile left it: written above, or kept.
    let status_now = match &verdict.publish {
        Publish::Write(u) => Some(checkpoint::Published {
            phase: u.phase,
            message: &u.message,
            services: &u.services,
        }),
        Publish::Delete => None,
        Publish::Nothing => previous.as_ref().map(|p| checkpoint::Published {
            phase: p.phase,
            message: &p.message,
            services: &p.services,
        }),
    };
    let checkpoints_waiting = match converging.filter(|_| verdict.failure.is_none()) {
        Some(d) => checkpoint::perform(ctx, d, status_now, &observed, steady, journal).await?,
        None => false,
    };
    let checkpoint_look = checkpoints_waiting.then(|| now + chrono::Duration::seconds(1));
    match verdict.failure {
        None => Ok(
            match plan
                .next_look()
                .into_iter()
                .chain(heal_at)
                .chain(pause_at)
                .chain(checkpoint_look)
                .min()
            {
                Some(until) => Next::After((until - now).to_std().unwrap_or_default()),
                None => Next::Idle,
            },
        ),
        Some(Failure::Teardown(e)) => Err(ReconcileError::Teardown(e)),
        Some(Failure::Provision(message)) => Err(ReconcileError::Provision(message)),
    }
}

/// Takes out of the plan every provision whose image is absent: its fetch
/// runs in the background (started here or joined) and wakes the sandbox
/// when it ends, so no worker slot waits for a pull or a build. Returns a
/// line per engine waiting, and a failure per engine whose fetch failed
/// (reported like any provisioning failure, and retried with backoff).
async fn await_images(
    ctx: &Context,
    desired: &DesiredSandbox,
    plan: &mut Plan,
) -> (
    Vec<String>,
    Vec<(EngineName, Result<ServiceStatus, String>)>,
) {
    let mut verdicts = BTreeMap::new();
    for p in plan.provisions() {
        // An engine this binary lacks is reported by provisioning.
        let Some(engine) = ctx.engines.get(p.engine) else {
            continue;
        };
        let image = ctx.config.images.image_for(engine, !p.features.is_empty());
        match ctx.images.need(&image, &desired.id).await {
            Availability::Go => {}
            other => {
                verdicts.insert(p.engine, other);
            }
        }
    }
    plan.actions.retain(|a| match a {
        Action::Provision(p) => !verdicts.contains_key(&p.engine),
        _ => true,
    });
    let mut awaiting = Vec::new();
    let mut failed = Vec::new();
    for (engine, verdict) in verdicts {
        match verdict {
            Availability::Fetching(why) => awaiting.push(format!("{engine}: {why}")),
            Availability::Failed(why) => failed.push((engine, Err(why))),
            Availability::Go => {}
        }
    }
    (awaiting, failed)
}

/// Applies the crash loop back-off to the heals the plan wants: a heal
/// that is due is recorded and kept; one that must wait, or that is given
/// up on (too many within the window at this generation of the row), is
/// taken out of the plan and returned.
fn hold_crash_loops(
    ctx: &Context,
    desired: &DesiredSandbox,
    plan: &mut Plan,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<(EngineName, HealGate)> {
    let policy = &ctx.config.crash_loop;
    let mut held = Vec::new();
    plan.actions.retain(|action| {
        let Action::Provision(p) = action else {
            return true;
        };
        if p.reason != ProvisionReason::Heal {
            return true;
        }
        let heals = ctx
            .crash_loops
            .heals(&desired.id, p.engine, desired.generation);
        match crash_loop::gate(&heals, now, policy) {
            HealGate::Now => {
                ctx.crash_loops.record(
                    &desired.id,
                    p.engine,
                    desired.generation,
                    now,
                    policy.window,
                );
                true
            }
            gate => {
                tracing::info!(engine = %p.engine, gate = ?gate, "heal held back: its container keeps dying");
                held.push((p.engine, gate));
                false
            }
        }
    });
    held
}

/// Holds back the reap of a deleted row while the reaping breaker is open,
/// or until a relist has looked at the fleet since the row went missing
/// (asking for one): when to look again, if held.
fn hold_reaping(
    ctx: &Context,
    id: &SandboxId,
    plan: &Plan,
    gone_since: Option<chrono::DateTime<chrono::Utc>>,
) -> Option<Next> {
    let since = gone_since?;
    if plan.wanted != Wanted::Deleted || plan.teardowns().next().is_none() {
        return None;
    }
    match ctx.breaker.may_reap(id, since) {
        Ok(()) => None,
        Err(Held::Paused(_)) => {
            tracing::debug!("reap held back: reaping is paused");
            Some(Next::After(ctx.config.relist_interval))
        }
        Err(Held::Unconfirmed) => {
            ctx.relist_now.notify_one();
            Some(Next::After(Duration::from_secs(1)))
        }
    }
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

/// How the row's owner container is doing.
async fn owner_state(ctx: &Context, name: &str) -> Result<OwnerState, ReconcileError> {
    Ok(match ctx.runtime.inspect(&ContainerId::new(name)).await? {
        None => OwnerState::Missing,
        Some(run) if run.running => OwnerState::Running,
        Some(run) => OwnerState::Exited(run.finished_at),
    })
}

/// Why each engine the plan heals needs it (looked up before the status
/// says `healing`, so that it can say why).
async fn heal_causes(ctx: &Context, plan: &Plan) -> BTreeMap<EngineName, HealCause> {
    let heals = plan
        .provisions()
        .filter(|p| p.reason == ProvisionReason::Heal)
        .map(|p| async move {
            let cause = provision::heal_cause(ctx.runtime.as_ref(), &p.replace).await;
            (p.engine, cause)
        });
    join_all(heals).await.into_iter().collect()
}

/// Provisions every engine the plan creates, at once.
async fn provision_all<'p>(
    ctx: &Context,
    desired: &DesiredSandbox,
    plan: &'p Plan,
    new_request: bool,
    causes: &BTreeMap<EngineName, HealCause>,
    commit: &Commit,
    reserved: &pool::Reserved<'_>,
) -> Vec<(&'p Provision, Result<Provisioned, String>)> {
    join_all(plan.provisions().map(|p| async move {
        let cause = causes.get(&p.engine).copied();
        let result =
            provision::provision(ctx, desired, p, new_request, cause, commit, reserved).await;
        (p, result.map_err(|e| e.to_string()))
    }))
    .await
}

/// Finishes the switches to rotations' new containers that were published
/// before the controller stopped (the old containers went as duplicates).
async fn promote_all(
    ctx: &Context,
    id: &SandboxId,
    network: &str,
    plan: &Plan,
) -> Vec<(EngineName, Result<ServiceStatus, String>)> {
    join_all(plan.promotions().map(|(engine, container, status)| async move {
        tracing::info!(%engine, %container, "finishing the switch to a rotation's published new container");
        let result =
            rotation::promote(ctx, id, network, engine, container, None, status.clone()).await;
        (engine, result.map_err(|e| e.to_string()))
    }))
    .await
}

/// Runs every due teardown; all are attempted even if one fails, and each
/// is noted in `journal`. Returns the first failure.
async fn teardown(ctx: &Context, plan: &Plan, journal: &mut Journal) -> Option<String> {
    let mut first_error = None;
    for t in plan.teardowns() {
        let result = ctx
            .runtime
            .remove(&t.container, ctx.config.stop_timeout)
            .await;
        journal.push(Event::reaped(
            t,
            result.as_ref().err().map(ToString::to_string).as_deref(),
        ));
        match result {
            Ok(()) => {
                ctx.metrics.reaped(t.reason);
                tracing::info!(
                    container = %t.container,
                    engine = t.engine.as_str(),
                    reason = t.reason.as_str(),
                    "container torn down"
                );
            }
            Err(e) => {
                ctx.metrics.teardown_failed();
                tracing::warn!(container = %t.container, error = %e, "teardown failed; will retry");
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    first_error
}
