//! Bringing one engine container up: its spec, the readiness probes, the
//! feature check, a claimant's credentials set over the engine's own
//! protocol, and the status of a container that is ready. The cold path
//! ([`super::provision`]) and the warm pool ([`super::pool`]) both build
//! on it; it knows neither of them.

use super::env::Env;
use super::image::ImageError;
use super::network::Placement;
use super::reach::{probe_address, InContainer};
use super::rotation::SwitchError;
use crate::config::ControllerConfig;
use crate::domain::host_net::RouteConflict;
use crate::domain::id::{ContainerId, EngineName};
use crate::domain::isolation::Isolation;
use crate::domain::sandbox::ServiceStatus;
use crate::engine::{Credentials, Engine, EngineError, Target};
use crate::ports::runtime::{
    Commands, ContainerSpec, Containers, Networks, RuntimeError, Tmpfs, Volume,
};
use crate::ports::store::StoreError;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// Why provisioning one engine failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Docker refused or failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The image is absent and could not be had.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The engine is not in this controller's registry.
    #[error("engine {0} is not known to this sandboxd")]
    UnknownEngine(EngineName),
    /// The container exited while sandboxd waited for it.
    #[error(
        "{engine} container {container} exited before it became ready (if its log says a feature is not available, use an image that ships it: --features-image {engine}=IMAGE, or drop the feature from the row); last log lines:\n{logs}"
    )]
    Exited {
        /// Engine name.
        engine: EngineName,
        /// Container name.
        container: String,
        /// Its id.
        id: ContainerId,
        /// Tail of its output, credentials scrubbed.
        logs: String,
    },
    /// The engine did not answer in time.
    #[error("{engine} container {container} did not become ready within {waited:?} ({last}){}; last log lines:\n{logs}", route_cause(.route.as_ref()))]
    NotReady {
        /// Engine name.
        engine: EngineName,
        /// Container name.
        container: String,
        /// Its id.
        id: ContainerId,
        /// How long sandboxd waited.
        waited: Duration,
        /// The last probe error.
        last: String,
        /// Why the host could not reach it, when the host's route for its
        /// address goes elsewhere (a stale bridge holds its subnet).
        route: Option<RouteConflict>,
        /// Tail of its output, credentials scrubbed.
        logs: String,
    },
    /// The row's seed could not be loaded: the container was removed.
    #[error(transparent)]
    Seed(#[from] super::seed::SeedError),
    /// A fork's copy of its source's data could not be had: nothing was
    /// created.
    #[error(transparent)]
    Fork(#[from] super::fork::ForkError),
    /// Enabling or verifying features failed.
    #[error("{0} (image {1})")]
    Feature(#[source] EngineError, String),
    /// The image says it does not ship a requested feature: refused before
    /// anything was created or removed.
    #[error("image {image} does not ship {engine} features {missing:?} (its label io.sandboxd.features lists {ships:?}); nothing was changed: configure an image that ships them (--features-image {engine}=IMAGE; deploy/images/build.sh builds sandboxd's) or drop them from the row")]
    ImageLacksFeatures {
        /// Engine name.
        engine: EngineName,
        /// The configured image.
        image: String,
        /// Requested features it lacks.
        missing: Vec<String>,
        /// What its label lists.
        ships: String,
    },
    /// The sandbox's isolation level needs an OCI runtime the daemon does
    /// not have: refused before anything was created or removed.
    #[error("isolation {isolation} needs the OCI runtime {runtime}, which the Docker daemon does not have (it has: {}); nothing was changed: install gVisor and register it with dockerd (scripts/run.sh does both with SANDBOXD_INSTALL_RUNSC=1; docs/security.md, \"gVisor\"), or ask for isolation 'container'", registered_list(.registered))]
    IsolationUnavailable {
        /// The level the sandbox runs under.
        isolation: Isolation,
        /// The runtime it needs.
        runtime: &'static str,
        /// What the daemon has.
        registered: Vec<String>,
    },
    /// The new container was ended from outside (`docker kill`, `stop`,
    /// `rm -f`) before it was ready: an interruption, not the engine's
    /// failure (a heal goes again at once, and its status says so).
    #[error(transparent)]
    Interrupted(Box<ProvisionError>),
    /// A rotation's new container could not be had or did not become
    /// ready: it was removed, and the running container was not touched.
    #[error("{0}; the rotation was abandoned: the running container keeps serving the published credentials and its data")]
    RotationAbandoned(#[source] Box<ProvisionError>),
    /// A rotation's new container is ready, but switching to it failed.
    #[error(transparent)]
    Switch(#[from] SwitchError),
    /// A rotation in place failed after its old container was removed (a
    /// persistent sandbox's volume holds one server at a time; a Swarm
    /// service cannot be renamed): the old credentials and features were
    /// restored (on the volume, with its data, if persistent).
    #[error("{0}; the rotation was rolled back: the old credentials and features were restored (a persistent sandbox's on its volume, with its data)")]
    RotationRolledBack(#[source] Box<ProvisionError>),
    /// A replace was about to remove a running container, and the row it
    /// was planned for has been deleted or rewritten since the plan read
    /// it: nothing was removed (a gone row's containers are the reaper's,
    /// after the grace window).
    #[error("the row was {0} while its {1} container was being replaced: nothing was removed; the next reconcile plans from the row as it is now")]
    RowChanged(&'static str, EngineName),
    /// Reading the row again before a replace failed.
    #[error("reading the row again before replacing its {1} container failed ({0}): nothing was removed; the next reconcile tries again")]
    RowUnread(#[source] StoreError, EngineName),
    /// A rotation in place failed, and so did restoring the old
    /// credentials.
    #[error("{failure}; restoring the old credentials failed too ({rollback}); the next attempt rotates again (a persistent sandbox's data is kept on its volume)")]
    RollbackFailed {
        /// Why the rotation failed.
        failure: Box<ProvisionError>,
        /// Why the restore failed.
        rollback: Box<ProvisionError>,
    },
    /// No start the row allows offered anything (a bug: the last start
    /// always offers).
    #[error("no start of {0}'s container was possible; this is a bug in sandboxd's start choice: report it with the sandbox's row")]
    NothingToStart(EngineName),
}

impl ProvisionError {
    /// The container that was started and did not come up, if that is
    /// what failed.
    fn started(&self) -> Option<&ContainerId> {
        match self {
            ProvisionError::Exited { id, .. } | ProvisionError::NotReady { id, .. } => Some(id),
            _ => None,
        }
    }

    /// Marks a started container's failure [`ProvisionError::Interrupted`]
    /// when `ordered` says the event stream reported an order for it. Read
    /// before sandboxd removes the container: its own removal reports a
    /// `kill` and a `destroy` too, and the watcher may record them before
    /// the reconcile looks, which would make every failed heal look
    /// interrupted and retry at once, forever.
    pub(crate) fn interrupted_if(self, ordered: impl FnOnce(&ContainerId) -> bool) -> Self {
        match self.started() {
            Some(id) if ordered(id) => ProvisionError::Interrupted(Box::new(self)),
            _ => self,
        }
    }

    /// Whether an order from outside ended the new container before it
    /// was ready.
    pub(crate) fn is_interrupted(&self) -> bool {
        matches!(self, ProvisionError::Interrupted(_))
    }

    /// Whether the failure came before anything was removed or created
    /// (the image, or an unknown engine).
    pub(crate) fn changed_nothing(&self) -> bool {
        matches!(
            self,
            ProvisionError::Image(_)
                | ProvisionError::ImageLacksFeatures { .. }
                | ProvisionError::IsolationUnavailable { .. }
                | ProvisionError::UnknownEngine(_)
                | ProvisionError::RowChanged(..)
                | ProvisionError::RowUnread(..)
        )
    }
}

/// The daemon's runtimes, for a message.
fn registered_list(registered: &[String]) -> String {
    if registered.is_empty() {
        "none".to_owned()
    } else {
        registered.join(", ")
    }
}

/// What a readiness timeout says of the route: nothing, or why the host
/// cannot reach the container.
fn route_cause(route: Option<&RouteConflict>) -> String {
    route.map(|r| format!(": {r}")).unwrap_or_default()
}

/// A fresh credential-set token (see [`crate::domain::labels::INSTANCE`]).
pub(crate) fn new_instance() -> String {
    crate::domain::entropy::alphanumeric(16)
}

/// The container sandboxd creates for `engine`: the image's sandbox mode
/// (non-secret environment and arguments, secrets on standard input), a
/// read-only root with tmpfs data (or `volume`'s, for a persistent
/// sandbox), `/tmp` and runtime directories, a non-root user, no
/// capabilities, caps, and a loopback port on `placement`'s network.
#[allow(clippy::too_many_arguments)]
pub fn container_spec(
    config: &ControllerConfig,
    engine: &'static dyn Engine,
    placement: &Placement,
    image: &str,
    credentials: &Credentials,
    features: &BTreeSet<String>,
    labels: HashMap<String, String>,
    volume: Option<Volume>,
) -> ContainerSpec {
    let scratch = |path: &str| Tmpfs {
        path: path.to_owned(),
        bytes: config.limits.scratch_bytes,
    };
    let persistent = volume.is_some();
    let mut tmpfs = Vec::new();
    if !persistent {
        tmpfs.push(Tmpfs {
            path: engine.data_path().to_owned(),
            bytes: config.limits.tmpfs_bytes,
        });
    }
    tmpfs.push(scratch("/tmp"));
    tmpfs.extend(engine.runtime_dirs().iter().map(|d| scratch(d)));
    ContainerSpec {
        name: placement.container.clone(),
        image: image.to_owned(),
        env: engine.container_env(credentials, features, persistent),
        cmd: engine.container_args(features, persistent),
        entrypoint: engine.entrypoint(),
        labels,
        port: engine.port(),
        host_port: None,
        network: placement.network.clone(),
        aliases: placement.aliases.clone(),
        user: engine.user().to_owned(),
        limits: config.limits,
        tmpfs,
        volume,
        template: None,
        start_from: None,
        binaries: None,
        stdin: Some(engine.secrets(credentials)),
        image_label: engine.image_label().map(str::to_owned),
        // The controller's level: a sandbox's own is set by its provision.
        runtime: config.isolation.runtime().map(str::to_owned),
    }
}

/// The credentials `s` publishes (a heal keeps them; a checkpoint logs in
/// with them).
pub(crate) fn published_credentials(s: &ServiceStatus) -> Credentials {
    Credentials {
        user: s.user.clone(),
        password: s.password.clone(),
        database: s.database.clone(),
    }
}

/// Waits for the engine in the container `id` (called `name`) to answer,
/// then enables and verifies `features` with the image `image`: returns
/// the host port its engine port is published on and the features it
/// has.
pub(crate) async fn bring_up(
    env: &Env,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    credentials: &Credentials,
    features: &BTreeSet<String>,
    image: &str,
) -> Result<(u16, Vec<String>), ProvisionError> {
    let host_port = env.runtime.published_port(id).await?.unwrap_or(0);
    bring_up_at(
        env,
        engine,
        id,
        name,
        host_port,
        credentials,
        features,
        image,
    )
    .await
}

/// [`bring_up`] of a container whose published port is known.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn bring_up_at(
    env: &Env,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
    credentials: &Credentials,
    features: &BTreeSet<String>,
    image: &str,
) -> Result<(u16, Vec<String>), ProvisionError> {
    let runtime = env.runtime.as_ref();
    let (host, port) = probe_address(env, engine, id, name, host_port).await?;
    let exec = InContainer { runtime, id };
    let target = exec.target(&host, port, credentials);
    let deadline = env.config.readiness_deadline(engine);
    poll_ready(runtime, engine, &target, id, name, deadline).await?;
    if features.is_empty() {
        // Nothing to enable or verify: spare the engine two more logins.
        return Ok((host_port, Vec::new()));
    }
    // A paused or wedged engine must not hold the reconcile: the check
    // gets the engine's readiness deadline once more.
    let available = tokio::time::timeout(deadline, engine.verify_features(&target, features))
        .await
        .unwrap_or_else(|_| {
            Err(EngineError::Client {
                engine: engine.name(),
                reason: format!("no answer to the feature check within {deadline:?}"),
            })
        })
        .map_err(|e| ProvisionError::Feature(e, image.to_owned()))?;
    Ok((host_port, available))
}

/// Gives the warm-pool container `id`, reached at `address` ([`probe_address`])
/// and logged in to with `pool`, `claimant`'s credentials
/// ([`Engine::claim`]), within `deadline`.
pub(crate) async fn claim_credentials(
    env: &Env,
    engine: &'static dyn Engine,
    id: &ContainerId,
    (host, port): (String, u16),
    pool: &Credentials,
    claimant: &Credentials,
    deadline: Duration,
) -> Result<(), EngineError> {
    let exec = InContainer {
        runtime: env.runtime.as_ref(),
        id,
    };
    let target = exec.target(&host, port, pool);
    tokio::time::timeout(deadline, engine.claim(&target, claimant))
        .await
        .unwrap_or_else(|_| {
            Err(EngineError::Client {
                engine: engine.name(),
                reason: format!("no answer to the claim within {deadline:?}"),
            })
        })
}

/// How many clients are connected to the engine in the container `id`
/// (called `name`, its engine port published on `host_port`), logged in to
/// with `credentials` ([`Engine::clients`]), within `--docker-timeout`.
pub(crate) async fn count_clients(
    env: &Env,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
    credentials: &Credentials,
) -> Result<Option<u32>, EngineError> {
    let (host, port) = probe_address(env, engine, id, name, host_port)
        .await
        .map_err(|e| EngineError::Client {
            engine: engine.name(),
            reason: format!("cannot say where it answers: {e}"),
        })?;
    let exec = InContainer {
        runtime: env.runtime.as_ref(),
        id,
    };
    let target = exec.target(&host, port, credentials);
    let deadline = env.config.docker_timeout;
    tokio::time::timeout(deadline, engine.clients(&target))
        .await
        .unwrap_or_else(|_| {
            Err(EngineError::Client {
                engine: engine.name(),
                reason: format!("no answer to counting client connections within {deadline:?}"),
            })
        })
}

/// The error of an engine in the container `id` (called `name`) that did
/// not answer since `started`, `last` saying why, with its logs; an
/// engine that is up but unreachable from the host may have the host's
/// route for its address going through another interface (a bridge that
/// outlived its network).
async fn not_ready(
    runtime: &(impl Networks + Containers + ?Sized),
    engine: &'static dyn Engine,
    target: &Target<'_>,
    id: &ContainerId,
    name: &str,
    started: Instant,
    last: &str,
) -> ProvisionError {
    let route = runtime.route_conflict(id).await.unwrap_or_else(|e| {
        tracing::debug!(container = name, error = %e, "could not check the host's route to the container");
        None
    });
    if let Some(conflict) = &route {
        tracing::warn!(container = name, cause = %conflict, "readiness timed out: the host's route to the container goes elsewhere");
    }
    ProvisionError::NotReady {
        engine: engine.name(),
        container: name.to_owned(),
        id: id.clone(),
        waited: started.elapsed(),
        route,
        last: scrub(last, target.credentials),
        logs: scrubbed_logs(runtime, id, target.credentials).await,
    }
}

/// Polls `engine`'s probe of the container `id` (called `name`), reached at
/// `host:port`, until it passes (returning how many probes failed first),
/// the container exits, or the engine's own deadline passes (a probe that
/// hangs, say on a paused container, is cut off at the deadline).
pub async fn wait_ready(
    runtime: &(impl Networks + Containers + Commands + ?Sized),
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host: &str,
    port: u16,
    credentials: &Credentials,
) -> Result<u32, ProvisionError> {
    let exec = InContainer { runtime, id };
    let target = exec.target(host, port, credentials);
    poll_ready(
        runtime,
        engine,
        &target,
        id,
        name,
        engine.readiness_deadline(),
    )
    .await
}

#[tracing::instrument(name = "wait_ready", skip_all, fields(attempts = tracing::field::Empty))]
async fn poll_ready(
    runtime: &(impl Networks + Containers + ?Sized),
    engine: &'static dyn Engine,
    target: &Target<'_>,
    id: &ContainerId,
    name: &str,
    within: Duration,
) -> Result<u32, ProvisionError> {
    let started = Instant::now();
    let deadline = started + within;
    // Short first waits: a container started from a template answers
    // within a few hundred milliseconds, and a failed probe is cheap.
    let mut delay = Duration::from_millis(25);
    let mut attempts = 0u32;
    loop {
        // No probe outlives the deadline, whatever the engine's client does.
        let left = deadline.saturating_duration_since(Instant::now());
        let probe = tokio::time::timeout(left, engine.probe(target))
            .await
            .unwrap_or_else(|_| {
                Err(EngineError::NotReady {
                    engine: engine.name(),
                    reason: format!("the probe did not answer within {left:?}"),
                })
            });
        let last = match probe {
            Ok(()) => {
                tracing::Span::current().record("attempts", attempts);
                tracing::debug!(
                    container = name,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "engine answers"
                );
                return Ok(attempts);
            }
            Err(e) => e.to_string(),
        };
        attempts += 1;
        if attempts % 5 == 0 && !runtime.inspect(id).await?.is_some_and(|s| s.running) {
            return Err(ProvisionError::Exited {
                engine: engine.name(),
                container: name.to_owned(),
                id: id.clone(),
                logs: scrubbed_logs(runtime, id, target.credentials).await,
            });
        }
        if Instant::now() >= deadline {
            return Err(not_ready(runtime, engine, target, id, name, started, &last).await);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

fn scrub(text: &str, credentials: &Credentials) -> String {
    text.replace(credentials.password.expose(), "***")
}

async fn scrubbed_logs(
    runtime: &(impl Containers + ?Sized),
    id: &ContainerId,
    credentials: &Credentials,
) -> String {
    let logs = runtime
        .logs_tail(id, 15)
        .await
        .unwrap_or_else(|e| format!("(logs unavailable: {e})"));
    scrub(&logs, credentials)
}
