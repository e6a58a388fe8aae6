//! Checkpoints and resets: performs what `sandbox_checkpoint` and
//! `sandbox_reset` asked for a ready sandbox, in the order they were asked,
//! and records each outcome (the request's row and an event). The engines
//! produce the commands ([`Engine::checkpoint_command`] and friends); they
//! run inside each engine's container through the runtime's exec, each
//! bounded by the runtime's deadline.

use super::bring_up::published_credentials;
use super::env::Env;
use crate::domain::checkpoint::{self, CheckpointName, Outcome, Step, Work};
use crate::domain::container::{ContainerState, ObservedContainer};
use crate::domain::event::{Event, Journal};
use crate::domain::id::ContainerId;
use crate::domain::sandbox::{DesiredSandbox, Phase, ServiceStatus, Services};
use crate::engine::Engine;
use crate::ports::runtime::Commands;
use crate::ports::store::StoreError;
use std::collections::BTreeMap;
use std::time::Instant;

/// Prints the container's memory use and cap as its cgroup counts them
/// (tmpfs pages included): `<used> <limit>`, cgroup v2 or v1.
const MEMORY: &str = "if [ -r /sys/fs/cgroup/memory.current ]; then \
    echo \"$(cat /sys/fs/cgroup/memory.current) $(cat /sys/fs/cgroup/memory.max)\"; \
    else echo \"$(cat /sys/fs/cgroup/memory/memory.usage_in_bytes) $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)\"; fi";

/// Why a checkpoint or reset of one engine failed (no credential: the
/// commands carry none, and the journal scrubs the messages again).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    /// The engine has no container running for the sandbox.
    #[error("{engine} has no running container (is the sandbox being healed?); ask again once it is ready")]
    NoContainer {
        /// Engine name.
        engine: String,
    },
    /// A command inside the container could not run or failed.
    #[error("{engine}: {what} failed: {detail}")]
    Command {
        /// Engine name.
        engine: String,
        /// What was run.
        what: &'static str,
        /// Its output's last lines, or why it could not run.
        detail: String,
    },
    /// The checkpoint would not fit under the container's memory cap.
    #[error("{engine}: {why}")]
    TooBig {
        /// Engine name.
        engine: String,
        /// The refusal, with what to do.
        #[source]
        why: TooBig,
    },
}

/// [`checkpoint::fits`]'s refusal.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TooBig(String);

/// The sandbox's status as this reconcile left it (written, or kept):
/// its phase, message and published engines.
pub(crate) struct Published<'a> {
    /// Lifecycle phase.
    pub(crate) phase: Phase,
    /// Why the phase is what it is.
    pub(crate) message: &'a str,
    /// Per-engine endpoints and credentials.
    pub(crate) services: &'a Services,
}

/// Performs the sandbox's pending checkpoint and reset requests, if its
/// status (`status`: as this reconcile published or kept it) is ready and
/// matches its running containers (`steady`: this reconcile changed no
/// container), at most [`checkpoint::STEPS_PER_RECONCILE`] of them. Returns
/// whether requests are left for a later look (the sandbox was not ready
/// for them, or more were pending than one reconcile performs).
pub(crate) async fn perform(
    env: &Env,
    desired: &DesiredSandbox,
    status: Option<Published<'_>>,
    observed: &[ObservedContainer],
    steady: bool,
    journal: &mut Journal,
) -> Result<bool, StoreError> {
    let work = env.store.checkpoint_work(&desired.id).await?;
    let (steps, more) = work.batch(checkpoint::STEPS_PER_RECONCILE);
    if steps.is_empty() {
        return Ok(false);
    }
    let services = match status {
        Some(s) if steady && s.phase == Phase::Ready => s.services,
        Some(s) if s.phase == Phase::Failed => {
            // Not a wait worth a look every second: each request ends.
            let Ok(term) = env.fence.check() else {
                return Ok(false);
            };
            let why = format!(
                "the sandbox is failed ({}); ask again once it is ready",
                s.message
            );
            for step in steps {
                finish(env, desired, &step, Err(why.clone()), term, journal).await?;
            }
            return Ok(more);
        }
        _ => return Ok(true),
    };
    for step in steps {
        let Ok(term) = env.fence.check() else {
            return Ok(true);
        };
        let result = if step.incarnation().is_some()
            && desired.incarnation.is_some()
            && step.incarnation() != desired.incarnation.as_ref()
        {
            Err("it was asked of an earlier incarnation of the row (the sandbox was released and requested again since)".to_owned())
        } else {
            perform_step(env, &work, services, observed, &step, journal).await
        };
        finish(env, desired, &step, result, term, journal).await?;
    }
    Ok(more)
}

/// Performs `step` on the sandbox's running containers, timed, counted
/// and logged; one that succeeded is journalled (a failure is, by
/// [`finish`]).
async fn perform_step(
    env: &Env,
    work: &Work,
    services: &Services,
    observed: &[ObservedContainer],
    step: &Step,
    journal: &mut Journal,
) -> Result<(u64, BTreeMap<String, String>), String> {
    let started = Instant::now();
    let (op, result) = match step {
        Step::Checkpoint { name, .. } => ("checkpoint", take(env, services, observed, name).await),
        Step::Reset(r) => (
            "reset",
            reset(env, work, services, observed, &r.checkpoint)
                .await
                .map(|()| (0, BTreeMap::new())),
        ),
    };
    env.metrics
        .lifecycle
        .checkpoint_done(op, result.is_ok(), started.elapsed().as_secs_f64());
    tracing::info!(
        op,
        request = step.request(),
        ok = result.is_ok(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "checkpoint request performed"
    );
    if let Ok((size, _)) = &result {
        journal.push(match step {
            Step::Checkpoint { name, .. } => Event::checkpointed(name, *size, started.elapsed()),
            Step::Reset(r) => Event::reset(&r.checkpoint, started.elapsed()),
        });
    }
    result
}

/// Records how `step` ended, in its row and (a failure) as an event.
async fn finish(
    env: &Env,
    desired: &DesiredSandbox,
    step: &Step,
    result: Result<(u64, BTreeMap<String, String>), String>,
    term: crate::domain::lease::Term,
    journal: &mut Journal,
) -> Result<(), StoreError> {
    match step {
        Step::Checkpoint { request, name, .. } => {
            let outcome = match result {
                Ok((size_bytes, instances)) => Outcome::Ready {
                    size_bytes,
                    instances,
                },
                Err(why) => {
                    journal.push(Event::checkpoint_failed("checkpoint", name, &why));
                    Outcome::Failed(why)
                }
            };
            env.store
                .finish_checkpoint(&desired.id, name, *request, &outcome, term)
                .await
        }
        Step::Reset(r) => {
            let outcome = match &result {
                Ok(_) => Ok(()),
                Err(why) => {
                    journal.push(Event::checkpoint_failed("reset", &r.checkpoint, why));
                    Err(why.as_str())
                }
            };
            env.store.finish_reset(r.request, outcome, term).await
        }
    }
}

/// The engines of the sandbox that have checkpoints, each with its
/// running container and login.
fn engines<'a>(
    env: &Env,
    services: &'a Services,
    observed: &[ObservedContainer],
) -> Result<Vec<(&'static dyn Engine, ContainerId, &'a ServiceStatus)>, String> {
    let mut out = Vec::new();
    for (name, service) in services {
        let Some(engine) = env.engines.lookup(name) else {
            continue;
        };
        let name_probe = CheckpointName::baseline();
        if engine
            .checkpoint_command(&published_credentials(service), &name_probe)
            .is_none()
        {
            continue;
        }
        let running =
            |c: &&ObservedContainer| c.labels.engine == *name && c.state == ContainerState::Running;
        let container = observed
            .iter()
            .filter(running)
            .find(|c| c.labels.instance == service.instance)
            .or_else(|| observed.iter().find(running))
            .ok_or_else(|| {
                CheckpointError::NoContainer {
                    engine: name.clone(),
                }
                .to_string()
            })?;
        out.push((engine, container.id.clone(), service.as_ref()));
    }
    if out.is_empty() {
        return Err("the sandbox has no engine that keeps checkpoints".to_owned());
    }
    Ok(out)
}

/// Takes checkpoint `name` of every engine: its size (all engines) and
/// the containers that hold it.
async fn take(
    env: &Env,
    services: &Services,
    observed: &[ObservedContainer],
    name: &str,
) -> Result<(u64, BTreeMap<String, String>), String> {
    let name = CheckpointName::parse(name).map_err(|e| e.to_string())?;
    if name.is_baseline() {
        return Err("baseline is reserved: sandboxd records it after provisioning".to_owned());
    }
    let engines = engines(env, services, observed)?;
    let runtime = env.runtime.as_ref();
    // Every engine is checked before any is copied: a refusal leaves no
    // half-taken checkpoint behind.
    for (engine, id, service) in &engines {
        let e = engine.name().as_str().to_owned();
        let Some(cmd) = engine.checkpoint_size_command(&published_credentials(service)) else {
            continue;
        };
        // Why the command could not run (under Swarm: the task is on
        // another node) is the operator's answer, so it is kept.
        let size = run(runtime, id, &cmd)
            .await
            .and_then(|out| {
                checkpoint::parse_size(&out).ok_or_else(|| "no size=<bytes> line".to_owned())
            })
            .map_err(|detail| {
                CheckpointError::Command {
                    engine: e.clone(),
                    what: "measuring the data",
                    detail,
                }
                .to_string()
            })?;
        let memory = run(runtime, id, &["sh".into(), "-c".into(), MEMORY.into()])
            .await
            .ok()
            .and_then(|out| checkpoint::parse_memory(&out));
        if let Some(memory) = memory {
            checkpoint::fits(size, memory).map_err(|why| {
                CheckpointError::TooBig {
                    engine: e.clone(),
                    why: TooBig(why),
                }
                .to_string()
            })?;
        }
    }
    let mut total = 0u64;
    let mut instances = BTreeMap::new();
    for (engine, id, service) in &engines {
        let Some(cmd) = engine.checkpoint_command(&published_credentials(service), &name) else {
            continue;
        };
        let e = engine.name().as_str().to_owned();
        let out = run(runtime, id, &cmd).await.map_err(|detail| {
            CheckpointError::Command {
                engine: e.clone(),
                what: "the checkpoint",
                detail,
            }
            .to_string()
        })?;
        total = total.saturating_add(checkpoint::parse_size(&out).unwrap_or(0));
        instances.insert(e, service.instance.clone());
    }
    Ok((total, instances))
}

/// Brings every engine back to checkpoint `target` (or the baseline).
async fn reset(
    env: &Env,
    work: &Work,
    services: &Services,
    observed: &[ObservedContainer],
    target: &str,
) -> Result<(), String> {
    let name = CheckpointName::parse(target).map_err(|e| e.to_string())?;
    let size = match work.ready(name.as_str()) {
        Some(c) => c.size_bytes.unwrap_or(0),
        None if name.is_baseline() => 0,
        None => {
            return Err(format!(
                "the sandbox has no ready checkpoint {name} (it failed, or was taken again and failed): take it again"
            ))
        }
    };
    let runtime = env.runtime.as_ref();
    let engines = engines(env, services, observed)?;
    // A reset may hold a copy of the checkpoint next to the data it
    // replaces until it is done (Postgres does): every container must have
    // room for the whole checkpoint (all engines' size: on the safe side).
    if size > 0 {
        for (engine, id, _) in &engines {
            let memory = run(runtime, id, &["sh".into(), "-c".into(), MEMORY.into()])
                .await
                .ok()
                .and_then(|out| checkpoint::parse_memory(&out));
            if let Some(memory) = memory {
                checkpoint::fits(size, memory).map_err(|why| {
                    CheckpointError::TooBig {
                        engine: engine.name().as_str().to_owned(),
                        why: TooBig(format!(
                            "the reset holds a copy of the checkpoint until it is done, and {why}"
                        )),
                    }
                    .to_string()
                })?;
            }
        }
    }
    for (engine, id, service) in engines {
        let Some(cmd) = engine.reset_command(&published_credentials(service), &name) else {
            continue;
        };
        run(runtime, &id, &cmd).await.map_err(|detail| {
            CheckpointError::Command {
                engine: engine.name().as_str().to_owned(),
                what: "the reset",
                detail,
            }
            .to_string()
        })?;
    }
    Ok(())
}

/// Runs `cmd` in container `id`: its output, or why it failed (the exit
/// code and the output's last lines).
async fn run(
    runtime: &(impl Commands + ?Sized),
    id: &ContainerId,
    cmd: &[String],
) -> Result<String, String> {
    let argv: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = runtime
        .exec(id, &argv, Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    if out.exit_code == 0 {
        Ok(out.output)
    } else {
        let tail: Vec<&str> = out.output.trim().lines().rev().take(4).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!("exit code {}: {}", out.exit_code, tail.join(" | ")))
    }
}
