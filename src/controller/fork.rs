//! Forks: the copy of a source sandbox's data that a fork's engine starts
//! from ([`crate::domain::fork`]).
//!
//! A helper container of the source's image, started first, shares the
//! source's PID and network namespaces (the engine is its pid 1, its files
//! under `/proc/1/root`, its port on the loopback) as the same user, with
//! the fork's volume mounted. The engine's copy script ([`ForkCopy`]) runs
//! with `docker exec`: `flush` in the source, serving, while the helper
//! starts, then `copy` in the helper. For Postgres the copy is a file-level image of the data
//! directory taken while every process of the source is frozen (`docker
//! pause`), so it is what a crash at that moment would leave and the
//! fork's server recovers it as after a crash; the source is frozen only
//! for that exec (about 0.2 s per 100 MiB here), keeps its sessions, and
//! serves again afterwards. For Redis and Valkey it is the RDB file of a
//! `SAVE`, a snapshot of its own. The fork's container mounts the volume
//! read-only and starts from it with the images' `SANDBOXD_TEMPLATE=use`:
//! the copy goes into its own tmpfs, under the fork's fresh credentials.
//!
//! While a copy runs, the source's container is in [`Copies`]: a reconcile
//! of the source does not thaw it (its row is not idle, so it would). A
//! copy is never abandoned half-way with the source frozen: it runs as a
//! task of its own that thaws the source whatever happens to the
//! reconcile that asked for it (and a controller that stops meanwhile
//! leaves a frozen container of a sandbox in use, which the next
//! reconcile of the source thaws).

use super::Context;
use crate::domain::container::ContainerState;
use crate::domain::container::ExecOutput;
use crate::domain::fork::{self, ForkOf};
use crate::domain::id::{ContainerId, EngineName};
use crate::domain::isolation::Isolation;
use crate::domain::labels::{self, ContainerLabels};
use crate::domain::network::container_name;
use crate::domain::plan::{Provision, ProvisionReason};
use crate::domain::sandbox::DesiredSandbox;
use crate::engine::{Credentials, Engine, ForkCopy};
use crate::ports::runtime::{Helper, Runtime, RuntimeError, Tmpfs, Volume};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a helper lives at most (it is removed as soon as the copy is
/// done; this bounds one sandboxd lost track of).
const HELPER_LIFETIME: Duration = Duration::from_secs(120);

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
pub(crate) async fn prepare(
    ctx: &Context,
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
        name: fork::volume_name(&ctx.config.deployment, &desired.id, p.engine),
        path: dir.to_owned(),
        labels: volume_labels,
        disk: None,
    };
    if p.reason != ProvisionReason::Heal {
        copy(
            ctx,
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
    ctx: &Context,
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
    let runtime_error = |source| ForkError::Runtime {
        source_id: source_id.clone(),
        engine: p.engine,
        source,
    };
    // One copy of a source at a time; whether it is frozen is read once
    // this copy's turn has come (a copy before it froze it meanwhile).
    let (source, _) = source_container(ctx, desired, of, p.engine).await?;
    let turn = ctx.forks.begin(&source).await;
    let (now, paused) = source_container(ctx, desired, of, p.engine).await?;
    if now != source {
        return Err(ForkError::SourceNotServing {
            source_id,
            engine: p.engine,
        });
    }
    let helper = helper(
        ctx,
        format!(
            "sandboxd-fork.{}.{}.{}",
            ctx.config.deployment, desired.id, p.engine
        ),
        (FORK_HELPER, desired.id.as_str()),
        image,
        engine,
        volume,
        &source,
    );
    let env = engine.container_env(credentials, &p.features, false);
    let job = Snapshot {
        source: source.clone(),
        paused,
        helper,
        how,
        data_path: engine.data_path(),
        env,
    };
    let outcome = snapshot(ctx.runtime.clone(), job, turn)
        .await
        .map_err(runtime_error);
    let result = outcome.and_then(|(out, frozen)| {
        if out.exit_code != 0 {
            return Err(ForkError::Copy {
                source_id: source_id.clone(),
                engine: p.engine,
                code: out.exit_code,
                output: crate::domain::seed::first_lines(&out.output),
            });
        }
        Ok((size_of(&out.output), frozen))
    });
    ctx.metrics
        .lifecycle
        .fork_copied(p.engine, result.is_ok(), started.elapsed());
    match &result {
        Ok((bytes, frozen)) => tracing::info!(
            source = %source_id,
            bytes,
            frozen_ms = frozen.as_millis() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "source's data copied for the fork"
        ),
        Err(e) => {
            tracing::warn!(source = %source_id, error = %e, "copying the source's data for the fork failed")
        }
    }
    result.map(|_| ())
}

/// One copy of a running container's data into a volume: what
/// [`snapshot`] needs.
pub(crate) struct Snapshot {
    /// The container copied.
    pub(crate) source: ContainerId,
    /// Whether it is frozen already (not flushed, frozen nor thawed here).
    pub(crate) paused: bool,
    /// The helper that sees it and mounts the volume.
    pub(crate) helper: Helper,
    /// The engine's copy script.
    pub(crate) how: ForkCopy,
    /// The engine's data directory in the source.
    pub(crate) data_path: &'static str,
    /// The copy's environment (the stamp a start from the copy checks).
    pub(crate) env: Vec<String>,
}

/// Copies `job.source`'s data into its helper's volume: the flush in the
/// source while the helper starts, then the copy in the helper, with the
/// source frozen if the engine needs it. Runs as a task of its own
/// (holding `hold` until it ends): whatever becomes of the caller, the
/// source is thawed and the helper removed. Returns the copy's output and
/// how long the source was frozen.
pub(crate) async fn snapshot<H: Send + 'static>(
    runtime: Arc<dyn Runtime>,
    job: Snapshot,
    hold: H,
) -> Result<(ExecOutput, Duration), RuntimeError> {
    let Snapshot {
        source,
        paused,
        helper,
        how,
        data_path,
        env,
    } = job;
    let op = |op: &str| -> Vec<String> {
        [
            "bash",
            "-c",
            how.script,
            "sandboxd-fork",
            op,
            data_path,
            helper.volume.path.as_str(),
        ]
        .map(str::to_owned)
        .into()
    };
    let (flush, copy) = (op("flush"), op("copy"));
    let task = tokio::spawn(async move {
        let _hold = hold;
        let exec = |id: ContainerId, cmd: Vec<String>, env: Vec<String>| {
            let runtime = runtime.clone();
            async move {
                let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
                runtime.exec(&id, &cmd, env).await
            }
        };
        // The source flushes (in itself: its pid 1 is its own engine)
        // while the helper starts. A paused source is frozen already, and
        // flushed what it had committed long before it froze.
        let flushing = async {
            if paused {
                Ok(None)
            } else {
                exec(source.clone(), flush, env.clone()).await.map(Some)
            }
        };
        let (started, flushed) = tokio::join!(runtime.start_helper(&helper), flushing);
        let id = match started {
            Ok(id) => id,
            Err(e) => {
                // A create that outlived its deadline may have left it.
                let _ = runtime
                    .remove(&ContainerId::new(helper.name.clone()), Duration::ZERO)
                    .await;
                return Err(e);
            }
        };
        let copied = async {
            if let Some(out) = flushed?.filter(|out| out.exit_code != 0) {
                return Ok((out, Duration::ZERO));
            }
            if paused || !how.freeze {
                // Frozen already, or an engine whose copy takes a
                // snapshot of its own.
                return Ok((exec(id.clone(), copy, env).await?, Duration::ZERO));
            }
            if let Err(e) = runtime.pause(&source).await {
                // A pause that did not answer may still have frozen it.
                let _ = runtime.unpause(&source).await;
                return Err(e);
            }
            let frozen_at = Instant::now();
            let copied = exec(id.clone(), copy, env).await;
            let thawed = runtime.unpause(&source).await;
            let frozen = frozen_at.elapsed();
            let copied = copied?;
            thawed?;
            Ok::<_, RuntimeError>((copied, frozen))
        }
        .await;
        // Killed at once (it holds nothing), off the caller's path.
        tokio::spawn(async move {
            if let Err(e) = runtime.remove(&id, Duration::ZERO).await {
                tracing::warn!(helper = %helper.name, error = %e, "could not remove a copy's helper; it exits on its own");
            }
        });
        copied
    });
    match task.await {
        Ok(done) => done,
        Err(e) => Err(RuntimeError::Refused(format!("the copy's task ended: {e}"))),
    }
}

/// The source's running container of `engine` (the one under the
/// engine's own name: a rotation's candidate is not published yet) and
/// whether it is frozen already (an idle, paused source).
async fn source_container(
    ctx: &Context,
    desired: &DesiredSandbox,
    of: &ForkOf,
    engine: EngineName,
) -> Result<(ContainerId, bool), ForkError> {
    let source_id = of.sandbox.to_string();
    // Claimed from the warm pool or created for it: found the one way
    // every part of the controller finds a sandbox's containers.
    let listed = super::containers::of_sandbox(ctx, &of.sandbox)
        .await
        .map_err(|source| ForkError::Runtime {
            source_id: source_id.clone(),
            engine,
            source,
        })?;
    let name = container_name(&ctx.config.deployment, &of.sandbox, engine);
    let incarnation = of.incarnation.to_string();
    let found = listed.into_iter().find(|c| {
        c.name == name
            && c.labels.engine == engine.as_str()
            && c.labels.owner == desired.owner
            && c.labels.incarnation.as_deref() == Some(incarnation.as_str())
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

/// A helper of `engine`'s `image` called `name`, which sees `source` and
/// mounts `volume`: labelled this deployment's and with `purpose` (a label
/// and value saying what it copies for), no engine (so no listing takes it
/// for a sandbox's container).
#[allow(clippy::too_many_arguments)]
pub(crate) fn helper(
    ctx: &Context,
    name: String,
    purpose: (&str, &str),
    image: &str,
    engine: &'static dyn Engine,
    volume: &Volume,
    source: &ContainerId,
) -> Helper {
    Helper {
        name,
        image: image.to_owned(),
        labels: HashMap::from([
            (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
            (
                labels::DEPLOYMENT.to_owned(),
                ctx.config.deployment.to_string(),
            ),
            (purpose.0.to_owned(), purpose.1.to_owned()),
        ]),
        user: engine.user().to_owned(),
        limits: ctx.config.limits,
        tmpfs: vec![Tmpfs {
            path: "/tmp".into(),
            bytes: ctx.config.limits.scratch_bytes,
        }],
        volume: volume.clone(),
        sees: source.clone(),
        lifetime: HELPER_LIFETIME,
    }
}

/// The label naming the fork a helper copies for.
const FORK_HELPER: &str = "io.sandboxd.fork-helper";

/// The `size=<bytes>` the copy printed (0 when it did not).
pub(crate) fn size_of(output: &str) -> u64 {
    output
        .lines()
        .find_map(|l| l.strip_prefix("size="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_size_is_read_from_its_output() {
        assert_eq!(size_of("size=104857600\n"), 104_857_600);
        assert_eq!(size_of("tar: a note\nsize=7"), 7);
        assert_eq!(size_of("nothing"), 0);
    }

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
