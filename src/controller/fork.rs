//! Forks: the copy of a source sandbox's data that a fork's engine starts
//! from ([`crate::domain::fork`]).
//!
//! The copy is taken by a helper next to the source while it serves
//! ([`super::copy`]). For Postgres it is a file-level image of the data
//! directory taken while every process of the source is frozen (`docker
//! pause`), so it is what a crash at that moment would leave and the
//! fork's server recovers it as after a crash; the source is frozen only
//! for that exec (about 0.2 s per 100 MiB here), keeps its sessions, and
//! serves again afterwards. For Redis and Valkey it is the RDB file of a
//! `SAVE`, a snapshot of its own. The fork's container mounts the volume
//! read-only and starts from it with the images' `SANDBOXD_TEMPLATE=use`:
//! the copy goes into its own tmpfs, under the fork's fresh credentials.
//! The source is found the one way every part of the controller finds a
//! sandbox's containers ([`super::containers`]), however it started.
//!
//! While a copy runs, the source's container is in [`Copies`]: a reconcile
//! of the source does not thaw it (its row is not idle, so it would). A
//! copy is never abandoned half-way with the source frozen: it runs as a
//! task of its own that thaws the source whatever happens to the
//! reconcile that asked for it (and a controller that stops meanwhile
//! leaves a frozen container of a sandbox in use, which the next
//! reconcile of the source thaws).

use super::copy::{helper, size_of, snapshot, Snapshot};
use super::env::Env;
use super::pool::Pool;
use crate::domain::container::{ContainerState, ExecOutput};
use crate::domain::fork::{self, ForkOf};
use crate::domain::id::{ContainerId, EngineName};
use crate::domain::isolation::Isolation;
use crate::domain::labels::ContainerLabels;
use crate::domain::network::container_name;
use crate::domain::plan::{Provision, ProvisionReason};
use crate::domain::sandbox::DesiredSandbox;
use crate::engine::{Credentials, Engine, ForkCopy};
use crate::ports::runtime::{RuntimeError, Volume};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Why a fork's engine could not start from its source's data.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The engine has no fork copy.
    #[error(
        "{engine} data cannot be forked: fork a sandbox without {engine}, or request a new sandbox"
    )]
    Unsupported {
        /// The engine.
        engine: EngineName,
    },
    /// The source has no running container of the engine.
    #[error("sandbox {source_id} has no running {engine} container to copy (it is still being provisioned, was released, or its {engine} is being healed); sandboxd tries again, and the fork is made once the source serves")]
    SourceNotServing {
        /// The source.
        source_id: String,
        /// The engine.
        engine: EngineName,
    },
    /// The source runs under gVisor, whose files are not the host's.
    #[error("sandbox {source_id} runs under gVisor (isolation gvisor), whose processes and files live inside gVisor's own kernel, where the copy cannot reach them: fork a sandbox with isolation 'container'")]
    Gvisor {
        /// The source.
        source_id: String,
    },
    /// Docker failed while copying.
    #[error("copying sandbox {source_id}'s {engine} data failed: {source}")]
    Runtime {
        /// The source.
        source_id: String,
        /// The engine.
        engine: EngineName,
        /// Why.
        #[source]
        source: RuntimeError,
    },
    /// The copy script failed.
    #[error("copying sandbox {source_id}'s {engine} data failed (exit {code}): {output}")]
    Copy {
        /// The source.
        source_id: String,
        /// The engine.
        engine: EngineName,
        /// Its exit code.
        code: i64,
        /// What it printed (no credential: the copy handles none).
        output: String,
    },
}

/// The source containers whose data is being copied now: not thawed by a
/// reconcile of their own sandbox meanwhile. One copy of a source at a
/// time: two would thaw each other's freeze.
#[derive(Debug, Default, Clone)]
pub(crate) struct Copies {
    copying: Arc<Mutex<HashSet<ContainerId>>>,
    turns: Arc<Mutex<HashMap<ContainerId, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Copies {
    /// Whether `id`'s data is being copied.
    pub(crate) fn copying(&self, id: &ContainerId) -> bool {
        self.copying.lock().unwrap().contains(id)
    }

    /// Waits for `id`'s turn, then marks it as being copied until the
    /// guard is dropped.
    async fn begin(&self, id: &ContainerId) -> CopyGuard {
        let turn = self
            .turns
            .lock()
            .unwrap()
            .entry(id.clone())
            .or_default()
            .clone();
        let turn = turn.lock_owned().await;
        self.copying.lock().unwrap().insert(id.clone());
        CopyGuard {
            copies: self.clone(),
            id: id.clone(),
            _turn: turn,
        }
    }
}

/// Takes a container out of [`Copies`] when dropped, and gives the next
/// copy of it its turn.
struct CopyGuard {
    copies: Copies,
    id: ContainerId,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for CopyGuard {
    fn drop(&mut self) {
        self.copies.copying.lock().unwrap().remove(&self.id);
        let mut turns = self.copies.turns.lock().unwrap();
        // Held by the map and this guard only: nobody waits for a turn.
        if turns
            .get(&self.id)
            .is_some_and(|t| Arc::strong_count(t) <= 2)
        {
            turns.remove(&self.id);
        }
    }
}

/// The volume a fork's container of `engine` starts from, when `desired`
/// is a fork: copied from the source now, unless `p` heals (a heal starts
/// from the copy the fork was made with, as a seeded sandbox's heal loads
/// its seed again). `None` for a row that is not a fork.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn prepare(
    env: &Env,
    pool: &Pool,
    copies: &Copies,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    labels: &ContainerLabels,
    image: &str,
    credentials: &Credentials,
) -> Result<Option<Volume>, ForkError> {
    let Some(of) = &desired.fork_of else {
        return Ok(None);
    };
    let (Some(how), Some(dir)) = (engine.fork_copy(), engine.start_dir()) else {
        return Err(ForkError::Unsupported { engine: p.engine });
    };
    let mut volume_labels = labels.of_volume();
    volume_labels.insert(FORK_OF.to_owned(), of.sandbox.to_string());
    let volume = Volume {
        name: fork::volume_name(&env.config.deployment, &desired.id, p.engine),
        path: dir.to_owned(),
        labels: volume_labels,
        disk: None,
    };
    if p.reason != ProvisionReason::Heal {
        copy(
            env,
            pool,
            copies,
            desired,
            of,
            engine,
            p,
            &volume,
            image,
            how,
            credentials,
        )
        .await?;
    }
    Ok(Some(volume))
}

/// The label naming the sandbox a fork's volume copies.
const FORK_OF: &str = "io.sandboxd.fork-of";

/// Copies the source's data for `engine` into `volume`.
#[allow(clippy::too_many_arguments)]
async fn copy(
    env: &Env,
    pool: &Pool,
    copies: &Copies,
    desired: &DesiredSandbox,
    of: &ForkOf,
    engine: &'static dyn Engine,
    p: &Provision,
    volume: &Volume,
    image: &str,
    how: ForkCopy,
    credentials: &Credentials,
) -> Result<(), ForkError> {
    let source_id = of.sandbox.to_string();
    let started = Instant::now();
    // One copy at a time; frozen or not is read once this one's turn came.
    let (source, _) = source_container(env, pool, desired, of, p.engine).await?;
    let turn = copies.begin(&source).await;
    let (now, paused) = source_container(env, pool, desired, of, p.engine).await?;
    if now != source {
        return Err(ForkError::SourceNotServing {
            source_id,
            engine: p.engine,
        });
    }
    let (deployment, fork) = (&env.config.deployment, &desired.id);
    let name = format!("sandboxd-fork.{deployment}.{fork}.{}", p.engine);
    let job = Snapshot {
        source: source.clone(),
        paused,
        helper: helper(
            env,
            name,
            (FORK_HELPER, fork.as_str()),
            image,
            engine,
            volume,
            &source,
        ),
        how,
        data_path: engine.data_path(),
        env: engine.container_env(credentials, &p.features, false),
    };
    let outcome = snapshot(env.runtime.clone(), job, turn).await;
    let result = judge(outcome, &source_id, p.engine);
    report(env, p, &source_id, &result, started.elapsed());
    result.map(|_| ())
}

/// What a copy of `source_id`'s `engine` came to: the bytes copied and
/// how long the source was frozen, or why it failed.
fn judge(
    outcome: Result<(ExecOutput, Duration), RuntimeError>,
    source_id: &str,
    engine: EngineName,
) -> Result<(u64, Duration), ForkError> {
    match outcome {
        Ok((out, _)) if out.exit_code != 0 => Err(ForkError::Copy {
            source_id: source_id.to_owned(),
            engine,
            code: out.exit_code,
            output: crate::domain::seed::first_lines(&out.output),
        }),
        Ok((out, frozen)) => Ok((size_of(&out.output), frozen)),
        Err(source) => Err(ForkError::Runtime {
            source_id: source_id.to_owned(),
            engine,
            source,
        }),
    }
}

/// Counts and logs a copy of `source_id`'s data that took `took`: its
/// size and how long the source was frozen, or why it failed.
fn report(
    env: &Env,
    p: &Provision,
    source_id: &str,
    result: &Result<(u64, Duration), ForkError>,
    took: Duration,
) {
    env.metrics
        .lifecycle
        .fork_copied(p.engine, result.is_ok(), took);
    match result {
        Ok((bytes, frozen)) => tracing::info!(
            source = %source_id,
            bytes,
            frozen_ms = frozen.as_millis() as u64,
            elapsed_ms = took.as_millis() as u64,
            "source's data copied for the fork"
        ),
        Err(e) => {
            tracing::warn!(source = %source_id, error = %e, "copying the source's data for the fork failed")
        }
    }
}

/// The source's running container of `engine` (the one under the
/// engine's own name: a rotation's candidate is not published yet) and
/// whether it is frozen already (an idle, paused source).
async fn source_container(
    env: &Env,
    pool: &Pool,
    desired: &DesiredSandbox,
    of: &ForkOf,
    engine: EngineName,
) -> Result<(ContainerId, bool), ForkError> {
    let source_id = of.sandbox.to_string();
    // Claimed from the warm pool or created for it: found the one way
    // every part of the controller finds a sandbox's containers.
    let listed = super::containers::of_sandbox(env, pool, &of.sandbox)
        .await
        .map_err(|source| ForkError::Runtime {
            source_id: source_id.clone(),
            engine,
            source,
        })?;
    let name = container_name(&env.config.deployment, &of.sandbox, engine);
    let incarnation = of.incarnation.to_string();
    #[cfg(any(test, feature = "simulation"))]
    let any_incarnation =
        crate::domain::mutation::on(crate::domain::mutation::Mutation::ForkWrongSource);
    #[cfg(not(any(test, feature = "simulation")))]
    let any_incarnation = false;
    let found = listed.into_iter().find(|c| {
        c.name == name
            && c.labels.engine == engine.as_str()
            && c.labels.owner == desired.owner
            && (any_incarnation || c.labels.incarnation.as_deref() == Some(incarnation.as_str()))
            && c.state == ContainerState::Running
    });
    let Some(c) = found else {
        return Err(ForkError::SourceNotServing { source_id, engine });
    };
    if c.labels.isolation == Isolation::Gvisor {
        return Err(ForkError::Gvisor { source_id });
    }
    Ok((c.id, c.paused))
}

/// The label naming the fork a helper copies for.
const FORK_HELPER: &str = "io.sandboxd.fork-helper";

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_source_is_copied_once_at_a_time_and_not_thawed_until_the_copy_ends() {
        let copies = Copies::default();
        let id = ContainerId::new("c1".to_owned());
        let first = copies.begin(&id).await;
        assert!(copies.copying(&id));
        let waiting = tokio::spawn({
            let (copies, id) = (copies.clone(), id.clone());
            async move {
                let _second = copies.begin(&id).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the second copy waits for its turn");
        drop(first);
        waiting.await.unwrap();
        assert!(!copies.copying(&id));
        assert!(
            copies.turns.lock().unwrap().is_empty(),
            "no turn left behind"
        );
    }
}
