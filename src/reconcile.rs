//! `reconcile(id)`: re-read both sides for one sandbox, plan, act, publish.
//! Level-triggered: it never trusts what woke it.

use crate::clock::Clock;
use crate::config::ControllerConfig;
use crate::engine;
use crate::heal_loop::HealLoops;
use crate::id::SandboxId;
use crate::metrics::Metrics;
use crate::model::{Phase, ServiceStatus};
use crate::plan::{self, Action, ProvisionReason, Wanted};
use crate::provision::{self, ProvisionError};
use crate::runtime::{self, RuntimeError};
use crate::store::{self, StoreError};
use bollard::Docker;
use futures::future::join_all;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Why a reconcile failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The state database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Docker failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// One or more engines failed to provision (status says which).
    #[error("provisioning failed: {0}")]
    Provision(String),
}

/// What the controller shares with every reconcile.
pub struct Context {
    /// State database.
    pub pool: PgPool,
    /// Docker.
    pub docker: Docker,
    /// Configuration.
    pub config: ControllerConfig,
    /// Injected clock.
    pub clock: Arc<dyn Clock>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Recent heals, for heal-loop detection.
    pub heal_loops: HealLoops,
}

/// What a successful reconcile asks of the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until something changes (or the periodic relist).
    Idle,
    /// Look again after this long (a reap waiting for its grace window).
    After(Duration),
}

/// Converges one sandbox.
pub async fn reconcile(ctx: &Context, id: &SandboxId) -> Result<Next, ReconcileError> {
    let desired = store::fetch_desired(&ctx.pool, id).await?;
    let observed = runtime::list_managed(&ctx.docker, &ctx.config.deployment, Some(id)).await?;
    let status = store::fetch_status(&ctx.pool, id).await?;
    let now = ctx.clock.now();
    let actions = plan::plan(
        desired.as_ref(),
        &observed,
        status.as_ref(),
        now,
        ctx.config.grace,
    );
    tracing::debug!(sandbox = %id, actions = actions.len(), "planned");

    let teardown_result = teardown(ctx, &actions).await;
    let next = match plan::next_wake(&actions) {
        Some(until) => Next::After((until - now).to_std().unwrap_or_default()),
        None => Next::Idle,
    };

    let desired = match (plan::wanted(desired.as_ref(), now), desired) {
        (Wanted::Yes, Some(d)) => d,
        (why, desired) => {
            teardown_result?;
            let remaining = actions.iter().any(|a| matches!(a, Action::Wait { .. }));
            match (why, remaining) {
                (Wanted::Deleted, false) => store::delete_status(&ctx.pool, id).await?,
                // An orphan (no row, no status) waiting out its grace
                // window: nothing to tell an orchestrator about.
                (Wanted::Deleted, true) if status.is_none() => {}
                _ => {
                    let message = if why == Wanted::Expired {
                        "expired: the row is past expires_at"
                    } else {
                        "deleted: waiting for the grace window before removing containers"
                    };
                    let generation = desired.map(|d| d.generation).unwrap_or_else(|| {
                        status.as_ref().map(|s| s.observed_generation).unwrap_or(0)
                    });
                    store::write_status(
                        &ctx.pool,
                        id,
                        Phase::Terminating,
                        generation,
                        message,
                        &BTreeMap::new(),
                    )
                    .await?;
                }
            }
            return Ok(next);
        }
    };

    // Start from what was published, so credentials being healed stay in
    // the status even if the controller stops mid-provision.
    let mut services: BTreeMap<String, ServiceStatus> = status
        .as_ref()
        .map(|s| {
            s.services
                .iter()
                .filter(|(engine, _)| desired.services.contains(engine))
                .map(|(e, s)| (e.clone(), s.clone()))
                .collect()
        })
        .unwrap_or_default();
    let mut provisions = Vec::new();
    for action in &actions {
        match action {
            Action::Keep { engine, status } => {
                services.insert(engine.clone(), status.clone());
            }
            Action::Provision { .. } => provisions.push(action),
            _ => {}
        }
    }

    let previous = status.as_ref().map(|s| s.observed_generation).unwrap_or(0);
    let new_request = previous < desired.generation;
    if !provisions.is_empty() {
        let engines: Vec<&str> = provisions
            .iter()
            .filter_map(|a| match a {
                Action::Provision { engine, .. } => Some(engine.as_str()),
                _ => None,
            })
            .collect();
        store::write_status(
            &ctx.pool,
            id,
            Phase::Provisioning,
            previous,
            &format!("provisioning {}", engines.join(", ")),
            &services,
        )
        .await?;
    }

    let results = join_all(
        provisions
            .iter()
            .map(|action| run_provision(ctx, &desired, action, new_request)),
    )
    .await;
    let mut failures = Vec::new();
    for (engine, result) in results {
        match result {
            Ok(s) => {
                services.insert(engine, s);
            }
            Err(e) => failures.push(format!("{engine}: {e}")),
        }
    }

    if new_request {
        ctx.metrics
            .generation_lag
            .observe(seconds_since(desired.updated_at));
    }
    if failures.is_empty() {
        if let Err(e) = teardown_result {
            store::write_status(
                &ctx.pool,
                id,
                Phase::Ready,
                desired.generation,
                &format!("ready; cleanup pending: {e}"),
                &services,
            )
            .await?;
            return Err(e);
        }
        store::write_status(
            &ctx.pool,
            id,
            Phase::Ready,
            desired.generation,
            "",
            &services,
        )
        .await?;
        Ok(next)
    } else {
        let message = failures.join("\n");
        store::write_status(
            &ctx.pool,
            id,
            Phase::Failed,
            desired.generation,
            &message,
            &services,
        )
        .await?;
        Err(ReconcileError::Provision(message))
    }
}

/// Seconds of wall time since `t`, never negative.
fn seconds_since(t: chrono::DateTime<chrono::Utc>) -> f64 {
    (chrono::Utc::now() - t)
        .to_std()
        .unwrap_or_default()
        .as_secs_f64()
}

/// Provisions one engine and records what happened. `new_request` is true
/// when the provision answers a desired-row change not yet observed.
async fn run_provision(
    ctx: &Context,
    desired: &crate::model::DesiredSandbox,
    action: &Action,
    new_request: bool,
) -> (String, Result<ServiceStatus, ProvisionError>) {
    let Action::Provision {
        engine: name,
        features,
        reuse,
        host_port,
        replace,
        reason,
    } = action
    else {
        unreachable!("only provision actions are passed");
    };
    let engine = engine::lookup(name).expect("the database only accepts registered engines");
    match reason {
        ProvisionReason::Heal => {
            let cause = heal_cause(ctx, replace).await;
            ctx.heal_loops.record(&desired.id);
            ctx.metrics.heals.with_label_values(&[name, cause]).inc();
            tracing::info!(sandbox = %desired.id, engine = name.as_str(), cause, "healing with the same credentials");
        }
        ProvisionReason::Rotate => ctx.metrics.rotations.with_label_values(&[name]).inc(),
        ProvisionReason::Create | ProvisionReason::Replace => {}
    }
    let started = std::time::Instant::now();
    tracing::info!(sandbox = %desired.id, engine = name.as_str(), reason = reason.as_str(), "provisioning");
    let result = provision::provision(
        &ctx.docker,
        &ctx.config,
        &ctx.metrics,
        provision::Request {
            desired,
            engine,
            features,
            reuse: reuse.as_ref(),
            host_port: *host_port,
            replace,
        },
    )
    .await;
    let outcome = if result.is_ok() { "success" } else { "error" };
    ctx.metrics
        .provisions
        .with_label_values(&[name, reason.as_str(), outcome])
        .inc();
    match &result {
        Ok(_) => {
            ctx.metrics
                .provision_seconds
                .with_label_values(&[name])
                .observe(started.elapsed().as_secs_f64());
            if new_request && *reason != ProvisionReason::Heal {
                ctx.metrics
                    .request_to_ready
                    .with_label_values(&[name])
                    .observe(seconds_since(desired.updated_at));
            }
            tracing::info!(sandbox = %desired.id, engine = name.as_str(), reason = reason.as_str(), elapsed_ms = started.elapsed().as_millis() as u64, "engine ready");
        }
        Err(e) => {
            tracing::warn!(sandbox = %desired.id, engine = name.as_str(), error = %e, "provisioning failed")
        }
    }
    (name.clone(), result)
}

/// Why a container needs healing: it is gone (`removed`), the kernel
/// killed it for memory (`oom`), or it stopped otherwise (`exited`).
async fn heal_cause(ctx: &Context, replaced: &[String]) -> &'static str {
    let Some(dead) = replaced.first() else {
        return "removed";
    };
    match runtime::was_oom_killed(&ctx.docker, dead).await {
        Ok(true) => "oom",
        _ => "exited",
    }
}

/// Runs every due teardown; all are attempted even if one fails.
async fn teardown(ctx: &Context, actions: &[Action]) -> Result<(), ReconcileError> {
    let mut first_error = None;
    for action in actions {
        if let Action::Teardown {
            container,
            engine,
            reason,
        } = action
        {
            match runtime::remove(&ctx.docker, container, ctx.config.stop_timeout).await {
                Ok(()) => {
                    ctx.metrics
                        .reaps
                        .with_label_values(&[reason.as_str()])
                        .inc();
                    tracing::info!(
                        container = container.as_str(),
                        engine = engine.as_str(),
                        reason = reason.as_str(),
                        "container torn down"
                    );
                }
                Err(e) => {
                    ctx.metrics.teardown_failures.inc();
                    tracing::warn!(container = container.as_str(), error = %e, "teardown failed; will retry");
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    first_error.map_or(Ok(()), |e| Err(e.into()))
}
