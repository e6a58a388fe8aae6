//! Provisioning one engine as the plan says: the image's features
//! checked, the replaced containers removed, then a warm-pool container
//! claimed ([`super::pool`]) or a new one created and brought up
//! ([`super::bring_up`]); a rotation switches to its new container
//! ([`rotation`]) or, in place, rolls back on failure.

pub use super::bring_up::{container_spec, wait_ready, ProvisionError};

use super::bring_up::{bring_up, new_instance, ready_status};
use super::fork;
use super::image;
use super::network;
use super::pool::{self, Reserved};
use super::recheck;
use super::rotation::{self, Commit};
use super::seed;
use super::seed_template;
use super::template;
use super::volume;
use super::Context;
use crate::domain::event::Origin;
use crate::domain::id::ContainerId;
use crate::domain::isolation::Isolation;
use crate::domain::labels::ContainerLabels;
use crate::domain::network::candidate_name;
use crate::domain::plan::{HealCause, Provision, ProvisionReason};
use crate::domain::sandbox::{DesiredSandbox, ServiceStatus};
use crate::domain::secret::Secret;
use crate::domain::seed::SeedHash;
use crate::engine::{Credentials, Engine};
use crate::ports::runtime::{ContainerSpec, Runtime, RuntimeError};
use std::time::Duration;
use tokio::time::Instant;

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
            ctx.metrics.lifecycle.healed(p.engine, cause);
            tracing::info!(cause = cause.as_str(), "healing with the same credentials");
        }
        ProvisionReason::Rotate => ctx.metrics.lifecycle.rotated(p.engine),
        ProvisionReason::Create | ProvisionReason::Replace => {}
    }
    let started = Instant::now();
    tracing::info!("provisioning");
    let result = match (
        create(ctx, desired, engine, p, commit.network(), reserved).await,
        &p.retire,
    ) {
        (Ok((_, status, origin, seed_file)), None) => Ok((status, origin, seed_file)),
        (Ok((new, status, origin, seed_file)), Some(old)) => {
            rotation::switch(ctx, commit, desired, p.engine, &new, old, status)
                .await
                .map(|status| (status, origin, seed_file))
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
        .lifecycle
        .provision_finished(p.engine, p.reason, result.is_ok(), started.elapsed());
    match &result {
        Ok((_, origin, _)) => {
            if new_request && p.reason != ProvisionReason::Heal {
                ctx.metrics.lifecycle.request_to_ready(
                    p.engine,
                    origin.as_str(),
                    ctx.seconds_since(desired.updated_at),
                );
            }
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "engine ready"
            );
        }
        Err(e) => tracing::warn!(error = %e, "provisioning failed"),
    }
    result.map(|(status, origin, seed_file)| Provisioned {
        status,
        origin,
        seed_file,
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
    /// Whether it started from its seed's data file (not loaded once ready).
    pub(crate) seed_file: bool,
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
    let seed = old.seed.clone();
    let restore = Provision {
        engine: p.engine,
        features: old.available_extensions.iter().cloned().collect(),
        host_port: Some(old.host_port),
        reuse: Some(old),
        replace: Vec::new(),
        retire: None,
        reason: ProvisionReason::Rotate,
        seed,
    };
    let none = Reserved::none(&ctx.pool);
    let restored = match create(ctx, desired, engine, &restore, commit.network(), &none).await {
        Ok((_, restored, _, _)) => restored,
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

/// Creates the container (or claims the warm-pool container `reserved`
/// holds for its engine) on the sandbox's `network` and brings it up; on
/// failure the new container is removed, so nothing leaks. A rotation's
/// new container (`p.retire` is set) is built next to the running one:
/// under a temporary name, without the engine's network alias and on a
/// host port of its own, so that clients keep reaching the old one.
/// Returns the container, its status (published under the engine's name
/// and alias), where it came from, and whether it started from its seed's
/// data file.
async fn create(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    network: &str,
    reserved: &Reserved<'_>,
) -> Result<(ContainerId, ServiceStatus, Origin, bool), ProvisionError> {
    let config = &ctx.config;
    let runtime = ctx.runtime.as_ref();
    let image = config.images.image_for(engine, !p.features.is_empty());
    ships_features(runtime, p, &image).await?;
    let isolation = desired.isolation_under(config.isolation);
    runtime_registered(runtime, isolation).await?;

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
    if p.reason == ProvisionReason::Replace && !p.replace.is_empty() {
        still_wanted(ctx, desired, p).await?;
    }
    for id in &p.replace {
        runtime.remove(id, config.stop_timeout).await?;
    }
    // The ready warm-pool container the reconcile reserved for this
    // engine, if any (the cold path below otherwise).
    if let Some(claimed) = pool::claim(
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
        return Ok((id, status, Origin::Pool, false));
    }

    cold(
        ctx,
        desired,
        engine,
        p,
        network,
        credentials,
        instance,
        image,
    )
    .await
}

/// Reads the row again before a replace removes the running container it
/// was planned against ([`recheck`]).
async fn still_wanted(
    ctx: &Context,
    desired: &DesiredSandbox,
    p: &Provision,
) -> Result<(), ProvisionError> {
    match recheck::since(ctx, desired).await {
        Ok(None) => Ok(()),
        Ok(Some(changed)) => Err(ProvisionError::RowChanged(changed.as_str(), p.engine)),
        Err(e) => Err(ProvisionError::RowUnread(e, p.engine)),
    }
}

/// Checks, before anything is removed, that the daemon has the OCI
/// runtime `isolation` needs: a sandbox never runs under less than it
/// asked for, and a rotation to a level the host cannot give must not
/// destroy the working container. Asks the daemon only for a level that
/// needs a runtime of its own.
async fn runtime_registered(
    runtime: &dyn Runtime,
    isolation: Isolation,
) -> Result<(), ProvisionError> {
    if isolation.runtime().is_none() {
        return Ok(());
    }
    let registered = runtime.oci_runtimes().await?;
    match isolation.missing_runtime(registered.as_deref()) {
        None => Ok(()),
        Some(missing) => Err(ProvisionError::IsolationUnavailable {
            isolation,
            runtime: missing,
            registered: registered.unwrap_or_default(),
        }),
    }
}

/// Checks, before anything is removed, that `image` ships the features
/// `p` asks for: a rotation to an image that cannot serve the row must not
/// destroy the working container.
async fn ships_features(
    runtime: &dyn Runtime,
    p: &Provision,
    image: &str,
) -> Result<(), ProvisionError> {
    // Present: the reconcile fetched it in the background first.
    let image_labels = image::labels(runtime, image).await?;
    let missing = image::missing_features(&image_labels, &p.features);
    if missing.is_empty() {
        return Ok(());
    }
    Err(ProvisionError::ImageLacksFeatures {
        engine: p.engine,
        image: image.to_owned(),
        missing,
        ships: image_labels
            .get(image::FEATURES_LABEL)
            .cloned()
            .unwrap_or_default(),
    })
}

/// The cold path of [`create`]: a new container of `image` with
/// `credentials` and the token `instance`, created on the sandbox's
/// `network` (from a template where one fits) and brought up.
#[allow(clippy::too_many_arguments)]
async fn cold(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    network: &str,
    credentials: Credentials,
    instance: String,
    image: String,
) -> Result<(ContainerId, ServiceStatus, Origin, bool), ProvisionError> {
    let config = &ctx.config;
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
        isolation: desired.isolation_under(config.isolation),
        seed: p.seed.clone(),
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
    spec.runtime = labels.isolation.runtime().map(str::to_owned);
    // A fork starts from its copy of the source's data, a data-file seed
    // from its file: mounted where a template would be, and started from
    // the same way.
    let fork = fork::prepare(ctx, desired, engine, p, &labels, &image, &credentials).await?;
    let seed_file = match (&fork, &p.seed) {
        (None, Some(hash)) => seed::data_file(ctx, engine, &image, hash).await?,
        _ => None,
    };
    // A seed of statements, from its seed's template once one is made
    // (never for a persistent sandbox: its data is its own volume).
    let seeded_copy = match (&fork, &p.seed, &seed_file) {
        (None, Some(hash), None) if !desired.persistent => {
            let kind = seed_template::Kind {
                engine,
                image: &image,
                features: &p.features,
                hash,
            };
            seed_template::ready(ctx, &kind).await
        }
        _ => None,
    };
    let from_seed_template = seeded_copy.is_some();
    // What is left to load once the engine is ready.
    let seed_later = p
        .seed
        .as_ref()
        .filter(|_| seed_file.is_none() && !from_seed_template);
    let seed_file_volume = seed_file;
    let seed_file = seed_file_volume.is_some();
    let start_from = fork.or(seed_file_volume).or(seeded_copy);
    let mut refused = if desired.persistent || start_from.is_some() {
        None
    } else {
        template::apply_or_refusal(ctx, engine, &p.features, &mut spec).await
    };
    if let Some(volume) = start_from {
        template::start_from(&mut spec, volume);
    }
    if let Some(term) = ctx.fence.term() {
        spec.labels
            .insert(crate::domain::lease::TERM_LABEL.into(), term.to_string());
    }
    let mut seed_later = seed_later;
    let (id, host_port, available) = loop {
        let started = start(
            ctx,
            desired,
            engine,
            p,
            &mut spec,
            &name,
            &credentials,
            &image,
            seed_later,
        )
        .await;
        let Err(e) = &started else { break started? };
        if matches!(e, ProvisionError::Interrupted(_)) {
            break started?;
        }
        if from_seed_template && spec.start_from.is_some() {
            // A seed's template that does not start the engine (a volume
            // damaged behind sandboxd's back) is forgotten, and this start
            // loads the seed instead; the seed's next pool container
            // copies it again.
            tracing::warn!(sandbox = %desired.id, container = %name, error = %e, "the engine did not start from its seed's template; loading the seed instead");
            if let Some(copy) = template::unstart_from(&mut spec) {
                seed_template::forget(ctx, &copy);
            }
            refused = template::apply_or_refusal(ctx, engine, &p.features, &mut spec).await;
            seed_later = p.seed.as_ref();
            continue;
        }
        if spec.template.is_none() {
            break started?;
        }
        // A template that does not start the engine (under Swarm, on a
        // node the template's job has not reached yet; anywhere, a volume
        // damaged behind sandboxd's back) costs this sandbox a second
        // start, cold, not a failure; the template's job runs again.
        tracing::warn!(sandbox = %desired.id, container = %name, error = %e, "the engine did not start from its template; starting it cold");
        forget_template(ctx, &spec);
        template::unapply(&mut spec);
        // Forgotten, the template's job starts again now, beside the cold
        // start, rather than at the next sandbox of its kind.
        let _ = template::for_container(ctx, engine, &image, &p.features).await;
    };
    let origin = match (&spec.template, refused) {
        _ if spec.start_from.is_some() && desired.fork_of.is_some() => Origin::Fork,
        _ if spec.start_from.is_some() && from_seed_template => Origin::SeedTemplate,
        (Some(_), _) => Origin::Template,
        (None, Some(refusal)) => Origin::ColdTemplateRefused(refusal),
        (None, None) => Origin::Cold,
    };
    ctx.metrics
        .lifecycle
        .container_started(p.engine, origin.as_str());
    let mut status = ready_status(
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
    status.node = node_of(ctx, &id).await;
    Ok((id, status, origin, seed_file))
}

/// The Swarm node the engine `id` runs on, for its status; not knowing
/// it fails nothing (the status then does not name one).
pub(crate) async fn node_of(ctx: &Context, id: &ContainerId) -> Option<String> {
    match ctx.runtime.node_of(id).await {
        Ok(node) => node,
        Err(e) => {
            tracing::debug!(container = %id, error = %e, "the engine's node is unknown");
            None
        }
    }
}

/// Creates `spec`'s container and brings its engine up (loading `seed`
/// into it once ready): its id, host port and available extensions. A container that does not come up is
/// removed (the next reconcile removes it if that fails).
#[allow(clippy::too_many_arguments)]
async fn start(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    spec: &mut ContainerSpec,
    name: &str,
    credentials: &Credentials,
    image: &str,
    seed: Option<&SeedHash>,
) -> Result<(ContainerId, u16, Vec<String>), ProvisionError> {
    let runtime = ctx.runtime.as_ref();
    let id = match network::create_and_start(ctx, &desired.id, spec).await {
        Ok(id) => id,
        // A removal that did not end is not cured by another port.
        Err(e) if spec.host_port.is_some() && !matches!(e, RuntimeError::NameStillHeld { .. }) => {
            // The old host port may be taken by now: take any port rather
            // than fail (the status publishes the new one).
            tracing::warn!(container = %name, error = %e, "could not keep the host port; using a new one");
            spec.host_port = None;
            network::create_and_start(ctx, &desired.id, spec).await?
        }
        Err(e) => return Err(e.into()),
    };
    let up = bring_up(
        ctx,
        engine,
        &id,
        name,
        credentials,
        &p.features,
        image,
        seed,
    );
    match up.await {
        Ok((host_port, available)) => Ok((id, host_port, available)),
        Err(e) => {
            let e = e.interrupted_if(|c| ctx.orders.of(c).is_some());
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
