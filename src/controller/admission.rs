//! Admission in the controller: the leader's [`Ledger`] of what each
//! sandbox holds and who waits (see [`crate::domain::admission`]), asked
//! by every reconcile that would create an engine, settled by every
//! reconcile, rebuilt from each term's first relist and pruned by later
//! ones.
//!
//! Correct under concurrent reconciles because the controller has one
//! leader (`controller::leader`, fenced) and the decision and the
//! reservation are one step under the ledger's lock: two reconciles of
//! one owner cannot both take its last slot. A reconcile that frees room
//! (its sandbox released, its containers removed) wakes the rows that may
//! be admitted next at once, so a waiting row is admitted within one
//! reconcile of the release, not at the next relist.

use super::env::Env;
use super::ControllerError;
use crate::config::ControllerConfig;
use crate::domain::admission::{Arrival, Ask, Decision, Holding, Ledger, Quota};
use crate::domain::container::ObservedContainer;
use crate::domain::event::{Event, Journal};
use crate::domain::gate;
use crate::domain::id::SandboxId;
use crate::domain::identity::Incarnation;
use crate::domain::plan::{self, Action, Plan, ProvisionReason, Wanted};
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus};
use crate::ports::runtime::RuntimeError;
use crate::sched::WorkQueue;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Mutex, MutexGuard};

/// The leader's admissions.
pub(crate) struct Admission {
    ledger: Mutex<Ledger>,
    /// Each owner's limits as last read (for the metrics).
    limits: Mutex<BTreeMap<String, Quota>>,
    /// The host's memory, read from Docker once.
    host: tokio::sync::OnceCell<Option<u64>>,
    queue: WorkQueue<SandboxId>,
}

impl Admission {
    /// An empty ledger; `queue` is woken for the rows that may go next.
    pub(crate) fn new(config: &ControllerConfig, queue: WorkQueue<SandboxId>) -> Self {
        let engine = u64::try_from(config.limits.memory_bytes).unwrap_or(0);
        // Learned pools are counted at their bound: they grow and shrink
        // with demand, never past it.
        let pooled =
            (config.warm_pool.values().sum::<usize>() + config.warm_pool_demand.max) as u64;
        Admission {
            ledger: Mutex::new(Ledger::new(engine, pooled * engine, config.memory_budget)),
            limits: Mutex::new(BTreeMap::new()),
            host: tokio::sync::OnceCell::new(),
            queue,
        }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding it leaves a consistent ledger (every
        // method finishes its change before it could panic).
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues the rows that may be admitted next (but `except`).
    fn wake(&self, ledger: &Ledger, except: &SandboxId) {
        for id in ledger.heads() {
            if &id != except {
                tracing::debug!(sandbox = %id, "room freed: looking at a waiting row");
                self.queue.add(id);
            }
        }
    }

    /// Sets the admission metrics from `ledger` (only the owners whose
    /// use changed: a full resync settles every sandbox).
    fn publish(&self, env: &Env, ledger: &mut Ledger) {
        let changed = ledger.take_changed();
        let mut limits = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        env.metrics.quota.set(
            ledger.budget(),
            ledger.admitted_bytes(),
            ledger.waiting(),
            &changed,
            &limits,
        );
        for (owner, _) in changed.iter().filter(|(_, u)| u.is_none()) {
            limits.remove(owner);
        }
    }
}

/// The host's memory budget: `--memory-budget`, else the host's memory
/// (read from Docker once) minus `--memory-reserve`; `None` when Docker
/// does not say how much memory the host has.
async fn budget(env: &Env, admission: &Admission) -> Result<Option<u64>, RuntimeError> {
    if let Some(budget) = env.config.memory_budget {
        return Ok(Some(budget));
    }
    let host = admission
        .host
        .get_or_try_init(|| async {
            let host = env.runtime.host_memory().await?;
            match host {
                Some(bytes) => tracing::info!(
                    host_bytes = bytes,
                    reserve_bytes = env.config.memory_reserve,
                    "memory budget for sandboxes: the host's memory minus --memory-reserve"
                ),
                None => tracing::warn!(
                    "Docker does not say how much memory the host has: no memory budget (set --memory-budget)"
                ),
            }
            Ok::<_, RuntimeError>(host)
        })
        .await?;
    Ok(host.map(|h| h.saturating_sub(env.config.memory_reserve)))
}

/// Asks the ledger to admit the engines `plan` creates for `desired`
/// (those with no container and no published credentials), all or none,
/// and reserves them if it does. When they must wait, the answer carries
/// the message for the status (the gate takes every create out of the
/// plan: [`crate::domain::gate`]).
pub(crate) async fn ask(
    env: &Env,
    admission: &Admission,
    desired: &DesiredSandbox,
    plan: &Plan,
    journal: &mut Journal,
) -> Result<gate::Admission, ControllerError> {
    let engines = created_engines(plan);
    if engines.is_empty() {
        let mut ledger = admission.ledger();
        if ledger.forget_waiter(&desired.id) {
            admission.wake(&ledger, &desired.id);
            admission.publish(env, &mut ledger);
        }
        return Ok(gate::Admission::Go);
    }
    let quota = env.store.owner_quota(&desired.owner).await?;
    let budget = budget(env, admission).await?;
    admission
        .limits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(desired.owner.clone(), quota);
    let ask = Ask {
        arrival: Arrival {
            at: desired.created_at,
            id: desired.id.clone(),
        },
        owner: desired.owner.clone(),
        engines,
        incarnation: desired.incarnation.clone(),
    };
    match decide(env, admission, &ask, quota, budget) {
        Decision::Admit => {
            env.metrics.quota.decided(None);
            Ok(gate::Admission::Go)
        }
        Decision::Wait { reason, message } => {
            env.metrics.quota.decided(Some(reason));
            tracing::info!(owner = %desired.owner, reason = reason.as_str(), %message, "not admitted: nothing is created");
            journal.push(Event::admission_waiting(reason, &message));
            Ok(gate::Admission::Wait(message))
        }
    }
}

/// The engines `plan` creates (not heals, rotates or replaces): what a
/// sandbox adds to its owner's use and the host's.
fn created_engines(plan: &Plan) -> BTreeSet<String> {
    (plan.actions.iter())
        .filter_map(|a| match a {
            Action::Provision(p) if p.reason == ProvisionReason::Create => {
                Some(p.engine.as_str().to_owned())
            }
            _ => None,
        })
        .collect()
}

/// The ledger's decision on `ask` under `quota` and the host's `budget`;
/// the row is no longer waiting unless it must wait again, and the row
/// behind an admitted one is woken.
fn decide(
    env: &Env,
    admission: &Admission,
    ask: &Ask,
    quota: Quota,
    budget: Option<u64>,
) -> Decision {
    let mut ledger = admission.ledger();
    ledger.set_budget(budget);
    let waited = ledger.forget_waiter(&ask.arrival.id);
    let decision = ledger.admit(ask, quota);
    if decision == Decision::Admit {
        let held = ledger.use_of(&ask.owner).sandboxes;
        tracing::debug!(owner = %ask.owner, held, "admitted");
    }
    if waited && decision == Decision::Admit {
        // The row behind it may be the head now.
        admission.wake(&ledger, &ask.arrival.id);
    }
    admission.publish(env, &mut ledger);
    decision
}

/// Takes `id` off the waiting rows (it asks for nothing: its row is
/// gone, unwanted or unreadable), waking the rows behind it.
pub(crate) fn forget(env: &Env, admission: &Admission, id: &SandboxId) {
    let mut ledger = admission.ledger();
    if ledger.forget_waiter(id) {
        admission.wake(&ledger, id);
        admission.publish(env, &mut ledger);
    }
}

/// Whose containers a reconcile settles: the sandbox's owner and, while
/// its row is wanted, the row's incarnation.
pub(crate) struct Holder<'a> {
    pub(crate) owner: &'a str,
    /// `Some` while the row is wanted: its incarnation.
    pub(crate) wanted: Option<Option<&'a Incarnation>>,
}

/// Whether `c` serves `incarnation` (or may: a container from before
/// incarnations, a row without one). A container of an earlier
/// incarnation of the id is on its way out: it holds room on the host,
/// not its owner's quota, so the row that came back is admitted on its
/// own, like any new row.
fn serves(c: &ObservedContainer, incarnation: Option<&Incarnation>) -> bool {
    Incarnation::may_match(
        c.labels.incarnation.as_deref(),
        incarnation.map(Incarnation::as_str),
    )
}

/// Records what `id` holds once its reconcile is done: the engines of
/// `observed` it did not tear down and, while its row is wanted, those it
/// publishes credentials for, counted against the owner while the row is
/// wanted and holds any of its own incarnation ([`serves`]). Wakes the
/// waiting rows when room freed.
pub(crate) fn settle(
    env: &Env,
    admission: &Admission,
    id: &SandboxId,
    holder: Holder<'_>,
    observed: &[ObservedContainer],
    torn_down: &HashSet<&crate::domain::id::ContainerId>,
    published: impl IntoIterator<Item = String>,
) {
    let left = observed.iter().filter(|c| !torn_down.contains(&c.id));
    let mut engines: BTreeSet<String> = left.clone().map(|c| c.labels.engine.clone()).collect();
    let mut own: BTreeSet<String> = BTreeSet::new();
    if let Some(incarnation) = holder.wanted {
        own.extend(
            left.filter(|c| serves(c, incarnation))
                .map(|c| c.labels.engine.clone()),
        );
        own.extend(published);
        engines.extend(own.iter().cloned());
    }
    let wanted = !own.is_empty();
    let incarnation = holder.wanted.flatten().filter(|_| wanted);
    let owner = holder.owner;
    let mut ledger = admission.ledger();
    let forgot = holder.wanted.is_none() && ledger.forget_waiter(id);
    if ledger.settle(id, owner, wanted, incarnation, engines) || forgot {
        admission.wake(&ledger, id);
    }
    admission.publish(env, &mut ledger);
}

/// What a term's first relist found: the ledger rebuilt from it (before
/// any reconcile runs), the rows that hold nothing and are `due` waiting
/// unjudged in arrival order.
pub(crate) fn rebuild(
    env: &Env,
    admission: &Admission,
    rows: &[DesiredSandbox],
    containers: &[&ObservedContainer],
    statuses: &crate::fleet_hash::HashMap<&SandboxId, &SandboxStatus>,
    due: &BTreeSet<&SandboxId>,
) {
    let (now, policy) = (env.clock.now(), env.policy());
    let (mut held, by_sandbox) = held_by_containers(containers);
    let mut unjudged = Vec::new();
    for row in rows {
        let status = statuses
            .get(&row.id)
            .filter(|s| s.incarnation.is_none() || s.incarnation == row.incarnation);
        // Wanted as a reconcile would judge it, but for its owner's
        // container, which is not known yet: counted while in doubt, so
        // that nothing is admitted in its room before its reconcile (a
        // status left `terminating` by a row since restored says
        // nothing).
        let wanted = plan::wanted_until(Some(row), None, now, &policy).0 == Wanted::Yes;
        let entry = held
            .entry(row.id.clone())
            .or_insert_with(|| (row.owner.clone(), false, None, BTreeSet::new()));
        entry.0.clone_from(&row.owner);
        if wanted {
            let published = status
                .iter()
                .flat_map(|s| s.services.keys())
                .filter(|e| row.services.iter().any(|w| w.as_str() == e.as_str()));
            entry.3.extend(published.clone().cloned());
            // Counted against the owner only with something of its own
            // incarnation (see [`serves`]).
            let own = by_sandbox
                .get(&row.id)
                .is_some_and(|cs| cs.iter().any(|c| serves(c, row.incarnation.as_ref())));
            entry.1 = own || published.count() > 0;
            entry.2 = row.incarnation.clone().filter(|_| entry.1);
        }
        if !entry.1 && wanted && row.invalid.is_none() && due.contains(&row.id) {
            unjudged.push((
                Arrival {
                    at: row.created_at,
                    id: row.id.clone(),
                },
                row.owner.clone(),
                row.services.len(),
            ));
        }
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        for (id, (owner, wanted, _, engines)) in &held {
            tracing::debug!(sandbox = %id, %owner, wanted, ?engines, "admission: holds");
        }
    }
    let mut ledger = admission.ledger();
    ledger.rebuild(held, unjudged);
    admission.publish(env, &mut ledger);
}

/// The containers of each sandbox.
type BySandbox<'c> = BTreeMap<&'c SandboxId, Vec<&'c ObservedContainer>>;

/// What `containers` hold on the host, by sandbox (its owner and
/// engines; not counted against the owner until a row says it is
/// wanted), and the containers of each sandbox.
fn held_by_containers<'c>(
    containers: &[&'c ObservedContainer],
) -> (BTreeMap<SandboxId, Holding>, BySandbox<'c>) {
    let mut held: BTreeMap<SandboxId, Holding> = BTreeMap::new();
    let mut by_sandbox = BySandbox::new();
    for c in containers {
        held.entry(c.labels.sandbox.clone())
            .or_insert_with(|| (c.labels.owner.clone(), false, None, BTreeSet::new()))
            .3
            .insert(c.labels.engine.clone());
        by_sandbox.entry(&c.labels.sandbox).or_default().push(c);
    }
    (held, by_sandbox)
}

/// Marks the start of a relist's lists (see [`prune`]).
pub(crate) fn mark(admission: &Admission) -> u64 {
    admission.ledger().mark()
}

/// Drops what a relist that began at `mark` found no trace of.
pub(crate) fn prune(
    env: &Env,
    admission: &Admission,
    mark: u64,
    seen: &crate::fleet_hash::HashSet<&SandboxId>,
) {
    let mut ledger = admission.ledger();
    ledger.prune(mark, |id| seen.contains(id));
    admission.publish(env, &mut ledger);
}
