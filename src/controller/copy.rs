//! A copy of a running container's data into a volume, while it serves:
//! what a fork starts from ([`super::fork`]) and what a seed's template is
//! ([`super::seed_template`]). A helper container of the source's image,
//! started first, shares the source's PID and network namespaces (the
//! engine is its pid 1, its files under `/proc/1/root`, its port on the
//! loopback) as the same user, with the volume mounted. The engine's copy
//! script ([`ForkCopy`]) runs with `docker exec`: `flush` in the source,
//! serving, while the helper starts, then `copy` in the helper, with the
//! source frozen (`docker pause`) for that exec where the engine's copy
//! needs it. The copy runs as a task of its own that thaws the source and
//! removes the helper whatever happens to its caller.

use super::env::Env;
use crate::domain::container::ExecOutput;
use crate::domain::id::ContainerId;
use crate::domain::labels;
use crate::engine::{Engine, ForkCopy};
use crate::ports::runtime::{Containers, Helper, Runtime, RuntimeError, Tmpfs, Volume};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long a helper lives at most (it is removed as soon as the copy is
/// done; this bounds one sandboxd lost track of).
const HELPER_LIFETIME: Duration = Duration::from_secs(120);

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
    let task = tokio::spawn(async move {
        let _hold = hold;
        take(runtime, job).await
    });
    match task.await {
        Ok(done) => done,
        Err(e) => Err(RuntimeError::Refused(format!("the copy's task ended: {e}"))),
    }
}

impl Snapshot {
    /// The copy script's command for `op` (`flush` or `copy`).
    fn command(&self, op: &str) -> Vec<String> {
        let path = self.helper.volume.path.as_str();
        let args = [self.how.script, "sandboxd-fork", op, self.data_path, path];
        ["bash", "-c"]
            .into_iter()
            .chain(args)
            .map(str::to_owned)
            .collect()
    }
}

/// [`snapshot`]'s work, in its own task: the source flushes (in itself:
/// its pid 1 is its own engine) while the helper starts, then the helper
/// copies; the helper is removed afterwards.
async fn take(
    runtime: Arc<dyn Runtime>,
    job: Snapshot,
) -> Result<(ExecOutput, Duration), RuntimeError> {
    let (flush, copy) = (job.command("flush"), job.command("copy"));
    let exec = |id: ContainerId, cmd: Vec<String>, env: Vec<String>| {
        let runtime = runtime.clone();
        async move {
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            runtime.exec(&id, &cmd, env).await
        }
    };
    // A paused source is frozen already, and flushed what it had
    // committed long before it froze.
    let flushing = async {
        match job.paused {
            true => Ok(None),
            false => exec(job.source.clone(), flush, job.env.clone())
                .await
                .map(Some),
        }
    };
    let (started, flushed) = tokio::join!(runtime.start_helper(&job.helper), flushing);
    let id = match started {
        Ok(id) => id,
        Err(e) => {
            // A create that outlived its deadline may have left it.
            let left = ContainerId::new(job.helper.name.clone());
            let _ = runtime.remove(&left, Duration::ZERO).await;
            return Err(e);
        }
    };
    let copied = match flushed {
        Ok(Some(out)) if out.exit_code != 0 => Ok((out, Duration::ZERO)),
        Ok(_) => {
            let freeze = !job.paused && job.how.freeze;
            let exec = || exec(id.clone(), copy, job.env.clone());
            copy_from(runtime.as_ref(), &job.source, freeze, exec).await
        }
        Err(e) => Err(e),
    };
    // Killed at once (it holds nothing), off the caller's path.
    let helper = job.helper.name;
    tokio::spawn(async move {
        if let Err(e) = runtime.remove(&id, Duration::ZERO).await {
            tracing::warn!(helper = %helper, error = %e, "could not remove a copy's helper; it exits on its own");
        }
    });
    copied
}

/// Runs the copy (`exec`), with `source` frozen meanwhile if `freeze`
/// (a source frozen already, or an engine whose copy takes a snapshot of
/// its own, is not): the copy's output and how long the source was
/// frozen. A source frozen here is thawed whatever the copy did.
async fn copy_from<F, Fut>(
    runtime: &(impl Containers + ?Sized),
    source: &ContainerId,
    freeze: bool,
    exec: F,
) -> Result<(ExecOutput, Duration), RuntimeError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<ExecOutput, RuntimeError>>,
{
    if !freeze {
        return Ok((exec().await?, Duration::ZERO));
    }
    if let Err(e) = runtime.pause(source).await {
        // A pause that did not answer may still have frozen it.
        let _ = runtime.unpause(source).await;
        return Err(e);
    }
    let frozen_at = Instant::now();
    let copied = exec().await;
    let thawed = runtime.unpause(source).await;
    let frozen = frozen_at.elapsed();
    let copied = copied?;
    thawed?;
    Ok((copied, frozen))
}

/// A helper of `engine`'s `image` called `name`, which sees `source` and
/// mounts `volume`: labelled this deployment's and with `purpose` (a label
/// and value saying what it copies for), no engine (so no listing takes it
/// for a sandbox's container).
#[allow(clippy::too_many_arguments)]
pub(crate) fn helper(
    env: &Env,
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
                env.config.deployment.to_string(),
            ),
            (purpose.0.to_owned(), purpose.1.to_owned()),
        ]),
        user: engine.user().to_owned(),
        limits: env.config.limits,
        tmpfs: vec![Tmpfs {
            path: "/tmp".into(),
            bytes: env.config.limits.scratch_bytes,
        }],
        volume: volume.clone(),
        sees: source.clone(),
        lifetime: HELPER_LIFETIME,
    }
}

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
}
