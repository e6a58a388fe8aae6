//! Pause on idle, resume on use: what `reconcile` does about
//! [`domain::pause`](crate::domain::pause). Before an idle sandbox is
//! paused or released, each engine about to go is asked for its client
//! connections ([`Engine::clients`](crate::engine::Engine::clients)); one
//! connected client is a use, recorded in the row (`last_used_at`), so the
//! sandbox's idleness starts again. Freezing and thawing go through the
//! runtime (deadline and fence layers included).

use super::bring_up;
use super::env::Env;
use super::fork::Copies;
use crate::domain::container::ObservedContainer;
use crate::domain::event::Event;
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::pause::Step;
use crate::domain::plan::{Plan, Wanted};
use crate::domain::sandbox::{SandboxStatus, ServiceStatus};
use crate::ports::runtime::RuntimeError;
use chrono::{DateTime, Utc};
use futures::future::join_all;
use std::time::Instant;

/// The containers whose clients decide whether the sandbox is idle: those
/// about to be frozen, or torn down for idleness, that are not frozen yet
/// (a frozen engine answers nobody), with their published entry.
fn asked<'a>(
    plan: &'a Plan,
    step: &Step,
    observed: &'a [ObservedContainer],
    previous: Option<&'a SandboxStatus>,
) -> Vec<(&'a ObservedContainer, &'a ServiceStatus)> {
    let published = |c: &ObservedContainer| {
        previous
            .and_then(|s| s.services.get(&c.labels.engine))
            .map(|s| &**s)
            .filter(|s| !s.instance.is_empty() && s.instance == c.labels.instance)
    };
    let ids: Vec<&ContainerId> = if plan.wanted == Wanted::Idle {
        plan.teardowns().map(|t| &t.container).collect()
    } else if plan.pause {
        step.freeze.iter().collect()
    } else {
        Vec::new()
    };
    observed
        .iter()
        .filter(|c| ids.contains(&&c.id) && !c.paused)
        .filter_map(|c| published(c).map(|s| (c, s)))
        .collect()
}

/// Whether a client is connected to an engine of the sandbox that the
/// plan would freeze or release for idleness. An engine that cannot be
/// asked (it does not answer, or cannot count) is no evidence of use: the
/// sandbox is as idle as its requests and touches say.
pub(crate) async fn in_use(
    env: &Env,
    plan: &Plan,
    step: &Step,
    observed: &[ObservedContainer],
    previous: Option<&SandboxStatus>,
) -> bool {
    let asks = asked(plan, step, observed, previous)
        .into_iter()
        .filter_map(|(c, status)| {
            let engine = env.engines.lookup(&c.labels.engine)?;
            Some(async move {
                let credentials = engine.credentials(status.password.clone());
                let result = bring_up::count_clients(
                    env,
                    engine,
                    &c.id,
                    &c.name,
                    status.host_port,
                    &credentials,
                )
                .await;
                (engine.name(), result)
            })
        });
    let mut used = false;
    for (engine, result) in join_all(asks).await {
        match result {
            Ok(Some(n)) if n > 0 => {
                tracing::info!(%engine, clients = n, "idle by its requests and touches, but clients are connected: in use");
                used = true;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(%engine, error = %e, "could not count client connections; judging idleness by requests and touches")
            }
        }
    }
    used
}

/// Records a use of the sandbox seen at `now` (see [`in_use`]); the row's
/// `last_used_at` afterwards.
pub(crate) async fn record_use(
    env: &Env,
    id: &SandboxId,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, crate::ports::store::StoreError> {
    env.metrics.lifecycle.idle_in_use();
    env.store.mark_used(id, now).await
}

/// The engine names of `ids` among `observed`, for events.
fn engines_of(ids: &[ContainerId], observed: &[ObservedContainer]) -> Vec<String> {
    let mut names: Vec<String> = observed
        .iter()
        .filter(|c| ids.contains(&c.id))
        .map(|c| c.labels.engine.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Thaws `step.thaw` (all at once). A wanted sandbox that was paused is
/// resumed (an event says so); one whose containers are about to be torn
/// down is thawed so that they take the stop signal. A container frozen
/// for a fork's copy is left to the copy, which thaws it when done.
pub(crate) async fn thaw(
    env: &Env,
    copies: &Copies,
    plan: &Plan,
    step: &Step,
    observed: &[ObservedContainer],
    journal: &mut crate::domain::event::Journal,
) -> Result<(), RuntimeError> {
    let thaw: Vec<ContainerId> = step
        .thaw
        .iter()
        .filter(|id| !copies.copying(id))
        .cloned()
        .collect();
    if thaw.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    let results = join_all(thaw.iter().map(|id| env.runtime.unpause(id))).await;
    let failed = results.into_iter().find_map(Result::err);
    if plan.wanted == Wanted::Yes {
        let engines = engines_of(&thaw, observed);
        let error = failed.as_ref().map(ToString::to_string);
        journal.push(Event::resumed(
            &engines,
            started.elapsed(),
            error.as_deref(),
        ));
        if failed.is_none() {
            env.metrics.lifecycle.resumed();
            tracing::info!(engines = ?engines, elapsed_ms = started.elapsed().as_millis() as u64, "paused sandbox resumed: used again");
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Freezes `step.freeze` (all at once): `Some(Ok)` when the sandbox is
/// paused as a whole afterwards, `Some(Err)` saying why not, `None` when
/// the plan does not pause it.
pub(crate) async fn freeze(
    env: &Env,
    step: &Step,
    observed: &[ObservedContainer],
    journal: &mut crate::domain::event::Journal,
) -> Option<Result<(), String>> {
    if !step.paused {
        return None;
    }
    if step.freeze.is_empty() {
        return Some(Ok(()));
    }
    let results = join_all(step.freeze.iter().map(|id| env.runtime.pause(id))).await;
    let engines = engines_of(&step.freeze, observed);
    let failed = results
        .into_iter()
        .find_map(Result::err)
        .map(|e| e.to_string());
    journal.push(Event::paused(&engines, failed.as_deref()));
    match failed {
        None => {
            env.metrics.lifecycle.paused();
            tracing::info!(engines = ?engines, "idle sandbox paused");
            Some(Ok(()))
        }
        Some(e) => {
            tracing::warn!(engines = ?engines, error = %e, "pausing the idle sandbox failed");
            Some(Err(e))
        }
    }
}
