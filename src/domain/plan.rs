//! The decision: from (desired row, observed containers, published status,
//! now) to the actions that converge them. Pure, so every case is a unit test.

use super::container::{ContainerState, ObservedContainer};
use super::id::{ContainerId, EngineName};
use super::isolation::Isolation;
use super::network::is_container_name;
use super::sandbox::{DesiredSandbox, IdleAction, SandboxStatus, ServiceStatus};
use super::seed::SeedHash;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Why an engine container is (re)created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProvisionReason {
    /// No usable container and no published credentials: fresh ones.
    Create,
    /// The container died or vanished: same credentials and endpoint.
    Heal,
    /// The row asks for more than the running container gives (features
    /// grew: the union; another seed; a stronger isolation level): fresh
    /// credentials. The running container keeps serving until the new one
    /// is ready ([`Provision::retire`]).
    Rotate,
    /// A running container whose credentials were never published
    /// (the controller stopped mid-provision): replaced with fresh ones.
    Replace,
}

impl ProvisionReason {
    /// Label value for metrics and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProvisionReason::Create => "create",
            ProvisionReason::Heal => "heal",
            ProvisionReason::Rotate => "rotate",
            ProvisionReason::Replace => "replace",
        }
    }
}

/// Why a container needed healing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HealCause {
    /// It is gone: removed from outside (`docker rm -f`).
    Removed,
    /// Killed or stopped from outside (`docker kill`, `docker stop`).
    Stopped,
    /// The kernel killed it for memory.
    Oom,
    /// Its process ended on its own (or its last heal did not come up).
    Exited,
}

impl HealCause {
    /// Label value for metrics and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HealCause::Removed => "removed",
            HealCause::Stopped => "stopped",
            HealCause::Oom => "oom",
            HealCause::Exited => "exited",
        }
    }

    /// What happened to the container, for messages.
    pub(crate) fn phrase(self) -> &'static str {
        match self {
            HealCause::Removed => "its container was removed",
            HealCause::Stopped => "its container was killed or stopped from outside",
            HealCause::Oom => "its container was killed for lack of memory",
            HealCause::Exited => "its container stopped",
        }
    }

    /// Whether something outside ended the container (an order, healed at
    /// once every time) rather than the engine itself (which counts
    /// towards the crash-loop back-off).
    pub(crate) fn is_outside_order(self) -> bool {
        matches!(self, HealCause::Removed | HealCause::Stopped)
    }
}

/// Why a container is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReapReason {
    /// The desired row was deleted (its status row still exists).
    Deleted,
    /// Neither a desired row nor a status row exists: a leftover, e.g. from
    /// a controller that lost its database or a crash before any status.
    Orphan,
    /// The row no longer lists the container's engine.
    ServiceDropped,
    /// The row is past `expires_at`.
    Expired,
    /// An extra container for an engine that already has a good one.
    Duplicate,
    /// The sandbox was not used for its idle timeout.
    Idle,
    /// The agent container the row names as its owner is gone.
    OwnerGone,
    /// An earlier incarnation's container: the row was deleted and inserted
    /// again, which is the explicit signal; torn down at once.
    Superseded,
}

impl ReapReason {
    /// Label value for metrics and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReapReason::Deleted => "deleted",
            ReapReason::Orphan => "orphan",
            ReapReason::ServiceDropped => "service_dropped",
            ReapReason::Expired => "expired",
            ReapReason::Duplicate => "duplicate",
            ReapReason::Idle => "idle",
            ReapReason::OwnerGone => "owner_gone",
            ReapReason::Superseded => "superseded",
        }
    }
}

/// Create (or re-create) one engine's container.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Provision {
    pub(crate) engine: EngineName,
    pub(crate) features: BTreeSet<String>,
    /// Credentials and endpoint to keep (heal), or `None` for fresh ones.
    pub(crate) reuse: Option<ServiceStatus>,
    /// Host port to try to keep when not reusing a status.
    pub(crate) host_port: Option<u16>,
    /// Containers of this engine to remove first.
    pub(crate) replace: Vec<ContainerId>,
    /// A rotation's running, published container: it keeps serving while
    /// the new one is built next to it, and is removed only once the new
    /// one is ready and published; if the new one fails it stays as it is.
    /// `None` for a persistent sandbox: its data volume holds one server at
    /// a time, so the old container is in `replace` (if the new one fails,
    /// the controller restores the old credentials on the volume).
    pub(crate) retire: Option<ContainerId>,
    pub(crate) reason: ProvisionReason,
    /// The seed the new container's data starts from (the row's for the
    /// engine; a heal's is the one published, which equals it).
    pub(crate) seed: Option<SeedHash>,
}

/// Remove one container now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Teardown {
    pub(crate) container: ContainerId,
    /// Its engine, as its label names it (it may be unknown to this binary).
    pub(crate) engine: String,
    pub(crate) reason: ReapReason,
}

/// One step towards the desired state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// The engine's container is fine: publish its existing status.
    Keep {
        /// The engine.
        engine: EngineName,
        /// Its published status.
        status: ServiceStatus,
    },
    /// Create the engine's container, removing `replace` first.
    Provision(Provision),
    /// The published container is a rotation's new one still under its
    /// temporary name (the controller stopped while switching to it): give
    /// it the engine's container name and network alias, then publish it.
    Promote {
        /// The engine.
        engine: EngineName,
        /// The container.
        container: ContainerId,
        /// Its published status.
        status: ServiceStatus,
    },
    /// Remove a container now.
    Teardown(Teardown),
    /// A container to reap that is still inside the grace window.
    Wait {
        /// The container.
        container: ContainerId,
        /// When it may be reaped: the grace window after it was created,
        /// and for a deleted row also after the row was seen gone,
        /// whichever ends later.
        until: DateTime<Utc>,
    },
}

/// Everything `plan` decided for one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub(crate) wanted: Wanted,
    /// The steps, engines in sorted order.
    pub(crate) actions: Vec<Action>,
    /// When the row may stop being wanted (it expires, goes idle, or its
    /// owner container's grace runs out): look at it again then.
    pub(crate) recheck_at: Option<DateTime<Utc>>,
    /// For a deleted row: until when what outlives its containers (a
    /// persistent sandbox's data volumes) is kept, the grace window counted
    /// from when the row was seen gone; look at it again then. `None` once
    /// that has passed, and for a row that exists.
    pub(crate) data_kept_until: Option<DateTime<Utc>>,
    /// The row is idle and asks to be paused rather than released
    /// (`idle_action = 'pause'`): its containers are kept, and frozen
    /// (see [`crate::domain::pause`]). Only with [`Wanted::Yes`].
    pub(crate) pause: bool,
}

impl Plan {
    /// The engines whose running container is kept, with their status.
    pub(crate) fn kept(&self) -> impl Iterator<Item = (EngineName, &ServiceStatus)> {
        self.actions.iter().filter_map(|a| match a {
            Action::Keep { engine, status } => Some((*engine, status)),
            _ => None,
        })
    }

    /// The published containers to switch to (see [`Action::Promote`]).
    pub(crate) fn promotions(
        &self,
    ) -> impl Iterator<Item = (EngineName, &ContainerId, &ServiceStatus)> {
        self.actions.iter().filter_map(|a| match a {
            Action::Promote {
                engine,
                container,
                status,
            } => Some((*engine, container, status)),
            _ => None,
        })
    }

    pub(crate) fn provisions(&self) -> impl Iterator<Item = &Provision> {
        self.actions.iter().filter_map(|a| match a {
            Action::Provision(p) => Some(p),
            _ => None,
        })
    }

    pub(crate) fn teardowns(&self) -> impl Iterator<Item = &Teardown> {
        self.actions.iter().filter_map(|a| match a {
            Action::Teardown(t) => Some(t),
            _ => None,
        })
    }

    /// The earliest time a waiting reap becomes due, if any.
    pub(crate) fn next_wake(&self) -> Option<DateTime<Utc>> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Wait { until, .. } => Some(*until),
                _ => None,
            })
            .min()
    }

    /// Whether a reap is waiting out its grace window.
    pub(crate) fn is_waiting(&self) -> bool {
        self.next_wake().is_some()
    }

    /// When to look at the sandbox again: a waiting reap, a recheck or the
    /// end of a deleted row's data grace, whichever comes first.
    pub(crate) fn next_look(&self) -> Option<DateTime<Utc>> {
        self.next_wake()
            .into_iter()
            .chain(self.recheck_at)
            .chain(self.data_kept_until)
            .min()
    }
}

/// The controller's settings that the plan weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How old a container must be before it is reaped (and how long an
    /// owner container may be missing or stopped).
    pub grace: Duration,
    /// The idle timeout of rows that set none (`None`: off).
    pub idle_timeout: Option<Duration>,
    /// Whether a rotation removes the old container before it creates the
    /// new one, as a persistent sandbox's always does: a runtime that
    /// cannot rename what it runs (Swarm services) cannot build the new
    /// one beside the old and give it the old one's name afterwards.
    pub(crate) rotate_in_place: bool,
    /// The least isolation level of every sandbox (`--runtime`); a row
    /// may ask for more (see [`DesiredSandbox::isolation_under`]).
    pub isolation: Isolation,
}

impl Policy {
    /// A policy with `grace`, no default idle timeout and Docker's
    /// default runtime.
    pub fn with_grace(grace: Duration) -> Self {
        Self {
            grace,
            idle_timeout: None,
            rotate_in_place: false,
            isolation: Isolation::Container,
        }
    }
}

/// How the agent container a row names as its owner is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerState {
    /// It is running (or restarting, or paused: alive).
    Running,
    /// It stopped at this time (`None`: Docker did not say when).
    Exited(Option<DateTime<Utc>>),
    /// No container has that name.
    Missing,
}

/// Whether a row wants anything, and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// The row exists and is not expired.
    Yes,
    /// The row was deleted.
    Deleted,
    /// The row is past `expires_at`.
    Expired,
    /// The row was not used for its idle timeout.
    Idle,
    /// The row's owner container is gone.
    OwnerGone,
}

/// `t + d`, saturating: a time past the calendar's end means "never"
/// (`t + TimeDelta::MAX` would panic).
fn add(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// When a row's owner container counts as gone: grace after it stopped,
/// or, if there is no such container, grace after the row last changed
/// (so an agent started just after its sandbox was asked for is not
/// mistaken for a gone one). `None` while it runs.
fn owner_gone_at(
    desired: &DesiredSandbox,
    owner: OwnerState,
    grace: Duration,
) -> Option<DateTime<Utc>> {
    match owner {
        OwnerState::Running => None,
        OwnerState::Exited(Some(at)) => Some(add(at.max(desired.updated_at), grace)),
        OwnerState::Exited(None) | OwnerState::Missing => Some(add(desired.updated_at, grace)),
    }
}

/// Decides whether the row wants anything at `now`, and when that may
/// change next (expiry, idleness, the owner's grace).
pub(crate) fn wanted_until(
    desired: Option<&DesiredSandbox>,
    owner: Option<OwnerState>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> (Wanted, Option<DateTime<Utc>>) {
    let Some(d) = desired else {
        return (Wanted::Deleted, None);
    };
    let expires = d.expiry();
    // A row that pauses when idle stays wanted: its idleness is
    // `pause_due`'s, and a recheck only until it is due.
    let pauses = d.idle_action == IdleAction::Pause;
    let idle = d.idle_at(policy.idle_timeout).filter(|_| !pauses);
    let pause_at = d
        .idle_at(policy.idle_timeout)
        .filter(|t| pauses && *t > now);
    let gone = d
        .owner_container
        .as_ref()
        .and(owner)
        .and_then(|o| owner_gone_at(d, o, policy.grace));
    let past = |t: Option<DateTime<Utc>>| t.is_some_and(|t| t <= now);
    let why = if past(expires) {
        Wanted::Expired
    } else if past(gone) {
        Wanted::OwnerGone
    } else if past(idle) {
        Wanted::Idle
    } else {
        Wanted::Yes
    };
    let recheck = [expires, idle, gone, pause_at]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .min();
    (why, recheck.filter(|_| why == Wanted::Yes))
}

/// Whether `desired` is idle at `now` and asks to be paused rather than
/// released (see [`Plan::pause`]).
pub(crate) fn pause_due(desired: &DesiredSandbox, now: DateTime<Utc>, policy: &Policy) -> bool {
    #[cfg(any(test, feature = "simulation"))]
    if super::mutation::on(super::mutation::Mutation::PauseBusy) {
        return desired.idle_action == IdleAction::Pause && desired.invalid.is_none();
    }
    desired.idle_action == IdleAction::Pause
        && desired.invalid.is_none()
        && desired
            .idle_at(policy.idle_timeout)
            .is_some_and(|t| t <= now)
}

/// Tears `c` down, or waits until it is older than `grace` and, when
/// `gone_since` is given, until `grace` has passed since then too.
fn reap(
    c: &ObservedContainer,
    reason: ReapReason,
    now: DateTime<Utc>,
    grace: Duration,
    gone_since: Option<DateTime<Utc>>,
) -> Action {
    let until = add(gone_since.map_or(c.created, |t| t.max(c.created)), grace);
    if now >= until || reason == ReapReason::Duplicate {
        Action::Teardown(Teardown {
            container: c.id.clone(),
            engine: c.labels.engine.clone(),
            reason,
        })
    } else {
        Action::Wait {
            container: c.id.clone(),
            until,
        }
    }
}

/// Whether `c` was made for another incarnation of `desired`'s id than
/// `desired` (a container without the label predates incarnations and is
/// judged as before, by the status's instance token). Never for a row that
/// cannot be read: it keeps every container.
fn is_superseded(c: &ObservedContainer, desired: Option<&DesiredSandbox>) -> bool {
    let Some(row) = desired
        .filter(|d| d.invalid.is_none())
        .and_then(|d| d.incarnation.as_ref())
    else {
        return false;
    };
    c.labels
        .incarnation
        .as_deref()
        .is_some_and(|theirs| theirs != row.as_str())
}

/// Tears down an earlier incarnation's container now, whatever its age.
fn supersede(c: &ObservedContainer) -> Action {
    Action::Teardown(Teardown {
        container: c.id.clone(),
        engine: c.labels.engine.clone(),
        reason: ReapReason::Superseded,
    })
}

/// Computes the actions for one sandbox.
///
/// `observed` are this deployment's containers for the sandbox; `status`
/// is what sandboxd published last (its credentials are the truth for
/// healing); `owner` is how the row's owner container is doing, if it
/// names one and it was looked at. `gone_since` is when the controller
/// first saw the row missing (ignored while the row exists): a deleted
/// row's or an orphan's containers are kept for the grace window after
/// that as well as after their creation, so that an emptied or restored
/// state database does not reap at once what is older than the grace
/// window. `None` for a missing row counts from `now`. `status` must be of
/// the row's incarnation (see `status::of_incarnation`); a container of
/// another incarnation of an existing row is torn down at once and never
/// counts as the row's. Engines are visited in sorted order.
pub(crate) fn plan(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
    owner: Option<OwnerState>,
    gone_since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Plan {
    let grace = policy.grace;
    #[cfg(any(test, feature = "simulation"))]
    let grace = if crate::domain::mutation::on(crate::domain::mutation::Mutation::IgnoreGrace) {
        Duration::ZERO
    } else {
        grace
    };
    let (superseded, live): (Vec<&ObservedContainer>, Vec<&ObservedContainer>) = observed
        .iter()
        .filter(|c| c.state != ContainerState::Removing)
        .partition(|c| is_superseded(c, desired));
    let superseded = superseded.into_iter().map(supersede);
    let mut by_engine: BTreeMap<&str, Vec<&ObservedContainer>> = BTreeMap::new();
    for c in &live {
        by_engine
            .entry(c.labels.engine.as_str())
            .or_default()
            .push(c);
    }

    let (why, recheck_at) = wanted_until(desired, owner, now, policy);
    let desired = match (why, desired) {
        (Wanted::Yes, Some(d)) => d,
        _ => {
            let reason = match (why, status) {
                (Wanted::Expired, _) => ReapReason::Expired,
                (Wanted::Idle, _) => ReapReason::Idle,
                (Wanted::OwnerGone, _) => ReapReason::OwnerGone,
                (_, Some(_)) => ReapReason::Deleted,
                (_, None) => ReapReason::Orphan,
            };
            // Only a missing row counts from when it was seen gone: the
            // other releases are decided from the row itself.
            let gone_since = desired.is_none().then(|| gone_since.unwrap_or(now));
            let actions = superseded
                .chain(live.iter().map(|c| reap(c, reason, now, grace, gone_since)))
                .collect();
            return Plan {
                wanted: why,
                actions,
                recheck_at: None,
                data_kept_until: gone_since.map(|t| add(t, grace)).filter(|t| *t > now),
                pause: false,
            };
        }
    };

    if desired.invalid.is_some() {
        // A row that cannot be read is not a signal to delete anything:
        // keep every container untouched until the row is fixed.
        return Plan {
            wanted: Wanted::Yes,
            actions: Vec::new(),
            recheck_at: None,
            data_kept_until: None,
            pause: false,
        };
    }
    let mut actions: Vec<Action> = superseded.collect();
    for (engine, containers) in &by_engine {
        // Containers of an engine the row names but this binary does not
        // know are kept: the row still wants them.
        if !desired.wants(engine) {
            actions.extend(
                containers
                    .iter()
                    .map(|c| reap(c, ReapReason::ServiceDropped, now, grace, None)),
            );
        }
    }

    let isolation = desired.isolation_under(policy.isolation);
    let mut services = desired.services.clone();
    services.sort();
    services.dedup();
    for engine in services {
        let wanted_features = desired.features_for(engine);
        let containers = by_engine
            .get(engine.as_str())
            .map_or(&[][..], Vec::as_slice);
        let published = status.and_then(|s| s.services.get(engine.as_str()).map(|s| &**s));
        let seen = EngineView {
            engine,
            containers,
            published,
            isolation,
        };
        let wanted = Asked {
            features: &wanted_features,
            seed: desired.seed_for(engine),
        };
        actions.extend(plan_engine(
            &seen,
            &wanted,
            desired.persistent || policy.rotate_in_place,
        ));
    }
    Plan {
        wanted: why,
        actions,
        recheck_at,
        data_kept_until: None,
        pause: pause_due(desired, now, policy),
    }
}

/// What the row asks of one engine's container.
struct Asked<'a> {
    /// At least these features.
    features: &'a BTreeSet<String>,
    /// Data started from exactly this seed (`None`: empty).
    seed: Option<&'a SeedHash>,
}

impl Asked<'_> {
    /// Whether a container with `features` whose data started from `seed`
    /// gives what is asked.
    fn met_by(&self, features: &BTreeSet<String>, seed: Option<&SeedHash>) -> bool {
        self.features.is_subset(features) && self.seed == seed
    }
}

fn plan_engine(seen: &EngineView<'_>, wanted: &Asked<'_>, in_place: bool) -> Vec<Action> {
    let running: Vec<&ObservedContainer> = seen
        .containers
        .iter()
        .copied()
        .filter(|c| c.state == ContainerState::Running || trusts_status())
        .collect();
    if let Some(actions) = keep_serving(seen, wanted, &running) {
        return actions;
    }
    if let Some(old) = running.iter().find(|c| seen.is_published(c)) {
        return vec![Action::Provision(rotate_running(
            seen, wanted, old, in_place,
        ))];
    }
    vec![Action::Provision(provision_afresh(
        seen,
        wanted,
        running.is_empty(),
    ))]
}

/// Whether a container that stopped counts as serving: never, except in a
/// controller broken on purpose for the simulation (`Mutation::TrustStatus`).
fn trusts_status() -> bool {
    #[cfg(any(test, feature = "simulation"))]
    return crate::domain::mutation::on(crate::domain::mutation::Mutation::TrustStatus);
    #[cfg(not(any(test, feature = "simulation")))]
    false
}

/// One engine's containers of a sandbox, what was published for it, and
/// the isolation level its container must run under.
struct EngineView<'a> {
    engine: EngineName,
    containers: &'a [&'a ObservedContainer],
    published: Option<&'a ServiceStatus>,
    isolation: Isolation,
}

impl EngineView<'_> {
    /// Every container of the engine but `except`.
    fn ids_except(&self, except: Option<&ContainerId>) -> Vec<ContainerId> {
        self.containers
            .iter()
            .filter(|c| Some(&c.id) != except)
            .map(|c| c.id.clone())
            .collect()
    }

    /// The container whose credentials the status holds.
    fn is_published(&self, c: &ObservedContainer) -> bool {
        #[cfg(any(test, feature = "simulation"))]
        if crate::domain::mutation::on(crate::domain::mutation::Mutation::ReplaceServing) {
            return false;
        }
        self.published
            .is_some_and(|p| !p.instance.is_empty() && p.instance == c.labels.instance)
    }

    /// Under the engine's own name (not a rotation's temporary one).
    fn canonical(&self, c: &ObservedContainer) -> bool {
        is_container_name(
            &c.name,
            &c.labels.deployment,
            &c.labels.sandbox,
            self.engine,
        )
    }
}

/// A running container whose credentials we published, that has every
/// wanted feature and runs under the sandbox's isolation level: keep it
/// (one under the engine's name first), remove any others. One under
/// another level is rotated like one that lacks a feature: a container
/// cannot change its runtime, and a row that raised its level must not
/// keep serving from the host's kernel. The published container is the live one: a rotation's new
/// container still under its temporary name was published while the old
/// one still ran, so it takes over.
fn keep_serving(
    seen: &EngineView<'_>,
    wanted: &Asked<'_>,
    running: &[&ObservedContainer],
) -> Option<Vec<Action>> {
    let status = seen.published?;
    let serves = |c: &ObservedContainer| {
        seen.is_published(c)
            && wanted.met_by(&c.labels.features, c.labels.seed.as_ref())
            && c.labels.isolation == seen.isolation
    };
    let good = running
        .iter()
        .find(|c| serves(c) && seen.canonical(c))
        .or_else(|| running.iter().find(|c| serves(c)))?;
    let engine = seen.engine;
    let mut actions = vec![if seen.canonical(good) {
        Action::Keep {
            engine,
            status: status.clone(),
        }
    } else {
        Action::Promote {
            engine,
            container: good.id.clone(),
            status: status.clone(),
        }
    }];
    #[cfg(any(test, feature = "simulation"))]
    if crate::domain::mutation::on(crate::domain::mutation::Mutation::IgnoreTwins) {
        return Some(actions);
    }
    actions.extend(seen.ids_except(Some(&good.id)).into_iter().map(|id| {
        Action::Teardown(Teardown {
            container: id,
            engine: engine.as_str().to_owned(),
            reason: ReapReason::Duplicate,
        })
    }));
    Some(actions)
}

/// A running published container that lacks a wanted feature, started
/// from another seed than the row's, or runs
/// under another isolation level than the sandbox's: rotate, building the new container before the old one goes (any other container
/// of the engine, such as an earlier attempt's, goes first). A persistent
/// sandbox's volume holds one server, and a runtime that cannot rename
/// (Swarm) cannot promote a second one: there (`in_place`) the old
/// container goes first and the new one tries to keep its host port.
fn rotate_running(
    seen: &EngineView<'_>,
    wanted: &Asked<'_>,
    old: &ObservedContainer,
    in_place: bool,
) -> Provision {
    let features = wanted
        .features
        .union(&old.labels.features)
        .cloned()
        .collect();
    let seed = wanted.seed.cloned();
    if in_place {
        Provision {
            engine: seen.engine,
            features,
            reuse: None,
            host_port: old.host_port.or(seen.published.map(|p| p.host_port)),
            replace: seen.ids_except(None),
            retire: None,
            reason: ProvisionReason::Rotate,
            seed,
        }
    } else {
        Provision {
            engine: seen.engine,
            features,
            reuse: None,
            // The old container holds its port until the new one is
            // ready: the new one gets its own.
            host_port: None,
            replace: seen.ids_except(Some(&old.id)),
            retire: Some(old.id.clone()),
            reason: ProvisionReason::Rotate,
            seed,
        }
    }
}

/// Nothing running with published credentials: heal with what the status
/// promised (its seed applied again), rotate to the union when the
/// features grew, or to the row's seed when it changed, while the
/// container was gone, else create (or replace a container whose
/// credentials were never published: the controller stopped
/// mid-provision).
fn provision_afresh(seen: &EngineView<'_>, wanted: &Asked<'_>, nothing_runs: bool) -> Provision {
    let fresh = |features: BTreeSet<String>, reason| Provision {
        engine: seen.engine,
        features,
        reuse: None,
        host_port: seen.published.map(|p| p.host_port),
        replace: seen.ids_except(None),
        retire: None,
        reason,
        seed: wanted.seed.cloned(),
    };
    let wanted_features = wanted.features;
    if let Some(p) = seen.published {
        let had: BTreeSet<String> = p.available_extensions.iter().cloned().collect();
        if wanted.met_by(&had, p.seed.as_ref()) {
            // Heal: the same credentials, endpoint and the features the
            // status promised.
            return Provision {
                reuse: Some(p.clone()),
                ..fresh(had, ProvisionReason::Heal)
            };
        }
        if nothing_runs {
            return fresh(
                had.union(wanted_features).cloned().collect(),
                ProvisionReason::Rotate,
            );
        }
    }
    let reason = if nothing_runs {
        ProvisionReason::Create
    } else {
        ProvisionReason::Replace
    };
    fresh(wanted_features.clone(), reason)
}

#[cfg(test)]
mod tests;
