//! Creating one engine container and bringing it to ready: image, container
//! with caps and labels, readiness, features, verification.

use super::image::{self, ImageError};
use super::network::{self, Placement};
use super::pool::Reserved;
use super::rotation::{self, Commit, SwitchError};
use super::template;
use super::volume;
use super::Context;
use crate::config::{ControllerConfig, ProbeVia};
use crate::domain::container::ExecOutput;
use crate::domain::event::Origin;
use crate::domain::id::{ContainerId, EngineName};
use crate::domain::labels::ContainerLabels;
use crate::domain::network::candidate_name;
use crate::domain::plan::{HealCause, Provision, ProvisionReason};
use crate::domain::sandbox::{DesiredSandbox, ServiceStatus};
use crate::domain::secret::Secret;
use crate::engine::{self, Credentials, Engine, EngineError, Exec, Target};
use crate::ports::runtime::{ContainerSpec, Runtime, RuntimeError, Tmpfs, Volume};
use async_trait::async_trait;
use rand::distr::{Alphanumeric, SampleString};
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
        /// Tail of its output, credentials scrubbed.
        logs: String,
    },
    /// The engine did not answer in time.
    #[error("{engine} container {container} did not become ready within {waited:?} ({last}); last log lines:\n{logs}")]
    NotReady {
        /// Engine name.
        engine: EngineName,
        /// Container name.
        container: String,
        /// How long sandboxd waited.
        waited: Duration,
        /// The last probe error.
        last: String,
        /// Tail of its output, credentials scrubbed.
        logs: String,
    },
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
    /// A rotation in place failed, and so did restoring the old
    /// credentials.
    #[error("{failure}; restoring the old credentials failed too ({rollback}); the next attempt rotates again (a persistent sandbox's data is kept on its volume)")]
    RollbackFailed {
        /// Why the rotation failed.
        failure: Box<ProvisionError>,
        /// Why the restore failed.
        rollback: Box<ProvisionError>,
    },
}

impl ProvisionError {
    /// Whether the failure came before anything was removed or created
    /// (the image, or an unknown engine).
    fn changed_nothing(&self) -> bool {
        matches!(
            self,
            ProvisionError::Image(_)
                | ProvisionError::ImageLacksFeatures { .. }
                | ProvisionError::UnknownEngine(_)
        )
    }
}

/// A fresh credential-set token (see [`crate::domain::labels::INSTANCE`]).
pub(crate) fn new_instance() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 16)
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
        binaries: None,
        stdin: Some(engine.secrets(credentials)),
        image_label: engine.image_label().map(str::to_owned),
    }
}

/// Provisions one engine as planned and records what happened. `new_request`
/// is true when it answers a desired-row change not yet observed; `cause`
/// says why a heal is needed (see [`heal_cause`]). A rotation that keeps
/// the running container until the new one is ready publishes the new one
/// through `commit`, then switches to it ([`rotation`]).
#[tracing::instrument(name = "provision", skip_all, fields(engine = %p.engine, reason = p.reason.as_str()))]
pub(crate) async fn provision(
    ctx: &Context,
    desired: &DesiredSandbox,
    p: &Provision,
    new_request: bool,
    cause: Option<HealCause>,
    commit: &Commit,
    reserved: &Reserved<'_>,
) -> Result<Provisioned, ProvisionError> {
    let engine = ctx
        .engines
        .get(p.engine)
        .ok_or(ProvisionError::UnknownEngine(p.engine))?;
    match p.reason {
        ProvisionReason::Heal => {
            let cause = cause.unwrap_or(HealCause::Exited);
            ctx.heal_loops.record(&desired.id);
            ctx.metrics.healed(p.engine, cause);
            tracing::info!(cause = cause.as_str(), "healing with the same credentials");
        }
        ProvisionReason::Rotate => ctx.metrics.rotated(p.engine),
        ProvisionReason::Create | ProvisionReason::Replace => {}
    }
    let started = Instant::now();
    tracing::info!("provisioning");
    let result = match (
        create(ctx, desired, engine, p, commit.network(), reserved).await,
        &p.retire,
    ) {
        (Ok((_, status, origin)), None) => Ok((status, origin)),
        (Ok((new, status, origin)), Some(old)) => {
            rotation::switch(ctx, commit, p.engine, &new, old, status)
                .await
                .map(|status| (status, origin))
                .map_err(ProvisionError::from)
        }
        (Err(e), Some(_)) => Err(ProvisionError::RotationAbandoned(Box::new(e))),
        (Err(e), None)
            if p.reason == ProvisionReason::Rotate
                && (desired.persistent || ctx.config.policy().rotate_in_place)
                && !e.changed_nothing() =>
        {
            Err(roll_back(ctx, desired, engine, p, e, commit).await)
        }
        (Err(e), None) => Err(e),
    };
    ctx.metrics
        .provision_finished(p.engine, p.reason, result.is_ok(), started.elapsed());
    match &result {
        Ok(_) => {
            if new_request && p.reason != ProvisionReason::Heal {
                ctx.metrics
                    .request_to_ready(p.engine, ctx.seconds_since(desired.updated_at));
            }
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "engine ready"
            );
        }
        Err(e) => tracing::warn!(error = %e, "provisioning failed"),
    }
    result.map(|(status, origin)| Provisioned {
        status,
        origin,
        elapsed: started.elapsed(),
    })
}

/// An engine provisioned: its status, where its container came from and
/// how long it took.
#[derive(Debug)]
pub(crate) struct Provisioned {
    /// The status to publish.
    pub(crate) status: ServiceStatus,
    /// Where the container came from.
    pub(crate) origin: Origin,
    /// How long the provision took.
    pub(crate) elapsed: Duration,
}

/// A rotation in place (a persistent sandbox's, or any under a runtime
/// that cannot rename) failed after its old container was removed:
/// re-creates what was published before (credentials, features, host
/// port; on the sandbox's volume if persistent), so its credentials (and
/// data) work again, and publishes it. Returns the error to report.
async fn roll_back(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    failure: ProvisionError,
    commit: &Commit,
) -> ProvisionError {
    let Some(old) = commit.standing(p.engine).await else {
        return failure;
    };
    tracing::warn!(error = %failure, "rotation failed; restoring the old credentials");
    let restore = Provision {
        engine: p.engine,
        features: old.available_extensions.iter().cloned().collect(),
        host_port: Some(old.host_port),
        reuse: Some(old),
        replace: Vec::new(),
        retire: None,
        reason: ProvisionReason::Rotate,
    };
    let none = Reserved::none(&ctx.pool);
    let restored = match create(ctx, desired, engine, &restore, commit.network(), &none).await {
        Ok((_, restored, _)) => restored,
        Err(e) => {
            return ProvisionError::RollbackFailed {
                failure: Box::new(failure),
                rollback: Box::new(e),
            }
        }
    };
    let note = "the rotation failed; the old credentials were restored";
    match commit.publish(ctx, p.engine, &restored, note).await {
        Ok(()) => ProvisionError::RotationRolledBack(Box::new(failure)),
        Err(e) => ProvisionError::RollbackFailed {
            failure: Box::new(failure),
            rollback: Box::new(e.into()),
        },
    }
}

/// Why a container needs healing: it is gone (`removed`), the kernel
/// killed it for memory (`oom`), or it stopped otherwise (`exited`).
pub(crate) async fn heal_cause(runtime: &dyn Runtime, replaced: &[ContainerId]) -> HealCause {
    let Some(dead) = replaced.first() else {
        return HealCause::Removed;
    };
    match runtime.inspect(dead).await {
        Ok(Some(state)) if state.oom_killed => HealCause::Oom,
        _ => HealCause::Exited,
    }
}

/// Creates the container (or claims the warm-pool container `reserved`
/// holds for its engine) on the sandbox's `network` and brings it up; on
/// failure the new container is removed, so nothing leaks. A rotation's
/// new container (`p.retire` is set) is built next to the running one:
/// under a temporary name, without the engine's network alias and on a
/// host port of its own, so that clients keep reaching the old one.
/// Returns the container, its status (published under the engine's name
/// and alias) and where it came from.
async fn create(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    network: &str,
    reserved: &Reserved<'_>,
) -> Result<(ContainerId, ServiceStatus, Origin), ProvisionError> {
    let config = &ctx.config;
    let runtime = ctx.runtime.as_ref();
    let image = config.images.image_for(engine, !p.features.is_empty());
    // Present: the reconcile fetched it in the background first.
    let image_labels = image::labels(runtime, &image).await?;
    let missing = image::missing_features(&image_labels, &p.features);
    if !missing.is_empty() {
        // Before anything is removed: a rotation to an image that cannot
        // serve the row must not destroy the working container.
        return Err(ProvisionError::ImageLacksFeatures {
            engine: p.engine,
            image,
            missing,
            ships: image_labels
                .get(image::FEATURES_LABEL)
                .cloned()
                .unwrap_or_default(),
        });
    }

    let credentials = match &p.reuse {
        Some(s) => Credentials {
            user: s.user.clone(),
            password: s.password.clone(),
            database: s.database.clone(),
        },
        None => engine.credentials(Secret::generate()),
    };
    // Every container gets its own token, heals included: the status
    // carries it only once this container is fully provisioned, so a
    // container left half-done by a crash is never mistaken for a
    // published one.
    let instance = new_instance();
    for id in &p.replace {
        runtime.remove(id, config.stop_timeout).await?;
    }
    // The ready warm-pool container the reconcile reserved for this
    // engine, if any (the cold path below otherwise).
    if let Some(claimed) = super::pool::claim(
        ctx,
        desired,
        engine,
        p,
        &credentials,
        &image,
        network,
        reserved,
    )
    .await
    {
        let (id, status) = claimed;
        return Ok((id, status, Origin::Pool));
    }

    let placement = network::placement(config, &desired.id, p.engine, network);
    let mut build = placement.clone();
    if p.retire.is_some() {
        build.container = candidate_name(&placement.container, &instance);
        build.aliases = Vec::new();
    }
    let name = build.container.clone();
    let labels = ContainerLabels {
        deployment: config.deployment.clone(),
        sandbox: desired.id.clone(),
        owner: desired.owner.clone(),
        engine: p.engine.as_str().to_owned(),
        generation: desired.generation,
        features: p.features.clone(),
        instance: instance.clone(),
        // Read by the reconcile before anything is planned.
        state_id: ctx.state.get().map(ToString::to_string),
        incarnation: desired.incarnation.as_ref().map(ToString::to_string),
    };
    let volume = desired
        .persistent
        .then(|| volume::data_volume(config, &labels, engine));
    let mut spec = container_spec(
        config,
        engine,
        &build,
        &image,
        &credentials,
        &p.features,
        labels.to_map(),
        volume,
    );
    spec.host_port = p.host_port;
    if !desired.persistent {
        template::apply(ctx, engine, &p.features, &mut spec).await;
    }
    if let Some(term) = ctx.fence.term() {
        spec.labels
            .insert(crate::domain::lease::TERM_LABEL.into(), term.to_string());
    }
    let id = match network::create_and_start(ctx, &desired.id, &spec).await {
        Ok(id) => id,
        Err(e) if spec.host_port.is_some() => {
            // The old host port may be taken by now: take any port rather
            // than fail (the status publishes the new one).
            tracing::warn!(container = %name, error = %e, "could not keep the host port; using a new one");
            spec.host_port = None;
            network::create_and_start(ctx, &desired.id, &spec).await?
        }
        Err(e) => {
            forget_template(ctx, &spec);
            return Err(e.into());
        }
    };

    match bring_up(ctx, engine, &id, &name, &credentials, &p.features, &image).await {
        Ok((host_port, available)) => {
            let origin = if spec.template.is_some() {
                Origin::Template
            } else {
                Origin::Cold
            };
            ctx.metrics.container_started(p.engine, origin.as_str());
            let status = ready_status(
                ctx,
                engine,
                p,
                placement.host,
                host_port,
                credentials,
                available,
                instance,
                &image,
            );
            Ok((id, status, origin))
        }
        Err(e) => {
            forget_template(ctx, &spec);
            if let Err(cleanup) = runtime.remove(&id, Duration::ZERO).await {
                tracing::warn!(container = %name, error = %cleanup, "could not remove the failed container; the next reconcile will");
            }
            Err(e)
        }
    }
}

/// A container from a template failed: the next one starts cold while
/// the template job checks (and if need be rebuilds) the template.
fn forget_template(ctx: &Context, spec: &ContainerSpec) {
    if let Some(template) = &spec.template {
        ctx.templates.forget(&template.name);
    }
}

/// The status of a container of `engine` that is ready, reached by
/// `host` on the sandbox's network and `host_port` on the host.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ready_status(
    ctx: &Context,
    engine: &'static dyn Engine,
    p: &Provision,
    host: String,
    host_port: u16,
    credentials: Credentials,
    available: Vec<String>,
    instance: String,
    image: &str,
) -> ServiceStatus {
    let port = engine.port();
    ServiceStatus {
        url: engine.url(&host, port, &credentials),
        env: engine::env_vars(engine, &ctx.config.env_prefix, &host, port, &credentials),
        host,
        port,
        host_port,
        user: credentials.user,
        password: credentials.password,
        database: credentials.database,
        available_extensions: available,
        instance,
        ready_at: Some(ctx.clock.now()),
        heals: match (&p.reuse, p.reason) {
            (Some(s), ProvisionReason::Heal) => s.heals.saturating_add(1),
            (Some(s), _) => s.heals,
            (None, _) => 0,
        },
        image: image.to_owned(),
    }
}

pub(crate) async fn bring_up(
    ctx: &Context,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    credentials: &Credentials,
    features: &BTreeSet<String>,
    image: &str,
) -> Result<(u16, Vec<String>), ProvisionError> {
    let host_port = ctx.runtime.published_port(id).await?.unwrap_or(0);
    bring_up_at(
        ctx,
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
    ctx: &Context,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
    credentials: &Credentials,
    features: &BTreeSet<String>,
    image: &str,
) -> Result<(u16, Vec<String>), ProvisionError> {
    let runtime = ctx.runtime.as_ref();
    let (mut host, port) = probe_address(ctx, engine, name, host_port);
    if ctx.config.probe_via == ProbeVia::Host {
        // A Swarm task publishes on its node, which may not be this host.
        if let Some(node) = runtime.published_host(id).await? {
            host = node;
        }
    }
    let exec = InContainer { runtime, id };
    let target = Target {
        host: &host,
        port,
        credentials,
        exec: &exec,
    };
    let deadline = ctx.config.readiness_deadline(engine);
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

/// Where the controller reaches the container `name` whose engine port is
/// published on `host_port` (`--probe-via`).
fn probe_address(
    ctx: &Context,
    engine: &'static dyn Engine,
    name: &str,
    host_port: u16,
) -> (String, u16) {
    match ctx.config.probe_via {
        ProbeVia::Host => ("127.0.0.1".to_owned(), host_port),
        ProbeVia::Network => (name.to_owned(), engine.port()),
    }
}

/// Gives the warm-pool container `id` (called `name`, its engine port
/// published on `host_port`), logged in to with `pool`, `claimant`'s
/// credentials ([`Engine::claim`]), within `deadline`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn claim_credentials(
    ctx: &Context,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
    pool: &Credentials,
    claimant: &Credentials,
    deadline: Duration,
) -> Result<(), EngineError> {
    let (host, port) = probe_address(ctx, engine, name, host_port);
    let exec = InContainer {
        runtime: ctx.runtime.as_ref(),
        id,
    };
    let target = Target {
        host: &host,
        port,
        credentials: pool,
        exec: &exec,
    };
    tokio::time::timeout(deadline, engine.claim(&target, claimant))
        .await
        .unwrap_or_else(|_| {
            Err(EngineError::Client {
                engine: engine.name(),
                reason: format!("no answer to the claim within {deadline:?}"),
            })
        })
}

/// Commands inside one container, through the runtime.
struct InContainer<'a> {
    runtime: &'a dyn Runtime,
    id: &'a ContainerId,
}

#[async_trait]
impl Exec for InContainer<'_> {
    async fn exec(&self, cmd: &[&str], env: Vec<String>) -> Result<ExecOutput, String> {
        self.runtime
            .exec(self.id, cmd, env)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Polls `engine`'s probe of the container `id` (called `name`), reached at
/// `host:port`, until it passes (returning how many probes failed first),
/// the container exits, or the engine's own deadline passes (a probe that
/// hangs, say on a paused container, is cut off at the deadline).
pub async fn wait_ready(
    runtime: &dyn Runtime,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host: &str,
    port: u16,
    credentials: &Credentials,
) -> Result<u32, ProvisionError> {
    let exec = InContainer { runtime, id };
    let target = Target {
        host,
        port,
        credentials,
        exec: &exec,
    };
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
    runtime: &dyn Runtime,
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
                logs: scrubbed_logs(runtime, id, target.credentials).await,
            });
        }
        if Instant::now() >= deadline {
            return Err(ProvisionError::NotReady {
                engine: engine.name(),
                container: name.to_owned(),
                waited: started.elapsed(),
                last: scrub(&last, target.credentials),
                logs: scrubbed_logs(runtime, id, target.credentials).await,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

fn scrub(text: &str, credentials: &Credentials) -> String {
    text.replace(credentials.password.expose(), "***")
}

async fn scrubbed_logs(
    runtime: &dyn Runtime,
    id: &ContainerId,
    credentials: &Credentials,
) -> String {
    let logs = runtime
        .logs_tail(id, 15)
        .await
        .unwrap_or_else(|e| format!("(logs unavailable: {e})"));
    scrub(&logs, credentials)
}
