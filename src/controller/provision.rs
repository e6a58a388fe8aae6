//! Provisioning one engine as the plan says: the image's features and
//! the isolation runtime checked, the replaced containers removed, the
//! container's labels and spec built, then started the way the row
//! allows ([`super::start`]); a rotation switches to its new container
//! ([`rotation`]) or, in place, rolls back on failure.

pub use super::bring_up::{container_spec, wait_ready, ProvisionError};

use super::bring_up::{new_instance, published_credentials};
use super::env::Env;
use super::image;
use super::network::{self, Placement};
use super::pool::{self, Reserved};
use super::recheck;
use super::rotation::{self, Commit};
use super::start::{self, ForSandbox, Job, Owner, Up};
use super::volume;
use super::Context;
use crate::domain::event::Origin;
use crate::domain::id::ContainerId;
use crate::domain::isolation::Isolation;
use crate::domain::labels::ContainerLabels;
use crate::domain::network::candidate_name;
use crate::domain::plan::{HealCause, Provision, ProvisionReason};
use crate::domain::pool::claim_kind;
use crate::domain::sandbox::{DesiredSandbox, ServiceStatus};
use crate::domain::secret::Secret;
use crate::domain::start::{Source, Wanted};
use crate::engine::{Credentials, Engine};
use crate::ports::runtime::{ContainerSpec, Host, Images};
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
        .env
        .engines
        .get(p.engine)
        .ok_or(ProvisionError::UnknownEngine(p.engine))?;
    count_reason(ctx, desired, p, cause);
    let started = Instant::now();
    tracing::info!("provisioning");
    let result = start_and_switch(ctx, desired, engine, p, commit, reserved).await;
    ctx.env.metrics.lifecycle.provision_finished(
        p.engine,
        p.reason,
        result.is_ok(),
        started.elapsed(),
    );
    match &result {
        Ok((_, origin, _)) => {
            if new_request && p.reason != ProvisionReason::Heal {
                let waited = ctx.env.seconds_since(desired.updated_at);
                (ctx.env.metrics.lifecycle).request_to_ready(p.engine, origin.as_str(), waited);
            }
            let elapsed_ms = started.elapsed().as_millis() as u64;
            tracing::info!(elapsed_ms, "engine ready");
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

/// Counts (and says) why `p` provisions: a heal, with its `cause`, or a
/// rotation.
fn count_reason(ctx: &Context, desired: &DesiredSandbox, p: &Provision, cause: Option<HealCause>) {
    match p.reason {
        ProvisionReason::Heal => {
            let cause = cause.unwrap_or(HealCause::Exited);
            ctx.heals.heal_loops.record(&desired.id);
            ctx.env.metrics.lifecycle.healed(p.engine, cause);
            tracing::info!(cause = cause.as_str(), "healing with the same credentials");
        }
        ProvisionReason::Rotate => ctx.env.metrics.lifecycle.rotated(p.engine),
        ProvisionReason::Create | ProvisionReason::Replace => {}
    }
}

/// Starts `p`'s container ([`start`]) and, for a rotation that keeps
/// the old one serving meanwhile, switches to it; a rotation in place
/// that failed after its old container went is rolled back
/// ([`roll_back`]). Returns the status to publish, where the container
/// came from and whether it started from its seed's data file.
async fn start_and_switch(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    commit: &Commit,
    reserved: &Reserved<'_>,
) -> Result<(ServiceStatus, Origin, bool), ProvisionError> {
    let started = start(ctx, desired, engine, p, commit.network(), reserved).await;
    match (started, &p.retire) {
        (Ok((_, status, origin, seed_file)), None) => Ok((status, origin, seed_file)),
        (Ok((new, status, origin, seed_file)), Some(old)) => rotation::switch(
            &ctx.env,
            &ctx.outbox.phases,
            commit,
            desired,
            p.engine,
            &new,
            old,
            status,
        )
        .await
        .map(|status| (status, origin, seed_file))
        .map_err(ProvisionError::from),
        (Err(e), Some(_)) => Err(ProvisionError::RotationAbandoned(Box::new(e))),
        (Err(e), None)
            if p.reason == ProvisionReason::Rotate
                && (desired.persistent || ctx.env.policy().rotate_in_place)
                && !e.changed_nothing() =>
        {
            Err(roll_back(ctx, desired, engine, p, e, commit).await)
        }
        (Err(e), None) => Err(e),
    }
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
    let none = Reserved::none(&ctx.sources.pool);
    let restored = match start(ctx, desired, engine, &restore, commit.network(), &none).await {
        Ok((_, restored, _, _)) => restored,
        Err(e) => {
            return ProvisionError::RollbackFailed {
                failure: Box::new(failure),
                rollback: Box::new(e),
            }
        }
    };
    let note = "the rotation failed; the old credentials were restored";
    match commit
        .publish(&ctx.env, &ctx.outbox.phases, p.engine, &restored, note)
        .await
    {
        Ok(()) => ProvisionError::RotationRolledBack(Box::new(failure)),
        Err(e) => ProvisionError::RollbackFailed {
            failure: Box::new(failure),
            rollback: Box::new(e.into()),
        },
    }
}

/// Starts `p`'s container: creates it (or claims the warm-pool container
/// `reserved` holds for its engine) on the sandbox's `network` and brings
/// it up, trying the starts the row allows in order ([`start::run`]); on
/// failure the new container is removed, so nothing leaks. A rotation's
/// new container
/// (`p.retire` is set) is built next to the running one: under a
/// temporary name, without the engine's network alias and on a host port
/// of its own, so that clients keep reaching the old one. Returns the
/// container, its status (published under the engine's name and alias),
/// where it came from, and whether it started from its seed's data file.
async fn start(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    network: &str,
    reserved: &Reserved<'_>,
) -> Result<(ContainerId, ServiceStatus, Origin, bool), ProvisionError> {
    let image = ctx
        .env
        .config
        .images
        .image_for(engine, !p.features.is_empty());
    make_room(&ctx.env, desired, p, &image).await?;
    let credentials = match &p.reuse {
        Some(s) => published_credentials(s),
        None => engine.credentials(Secret::generate()),
    };
    // A token of its own, heals included: published only once this
    // container is ready, so one a crash left half-done is never taken
    // for a published one.
    let labels = labels_of(&ctx.env, desired, p, new_instance());
    let wanted = wanted(&ctx.env, desired, p);
    let placement = network::placement(&ctx.env.config, &desired.id, p.engine, network);
    let job = Job {
        engine,
        spec: spec_of(
            &ctx.env,
            desired,
            engine,
            p,
            &labels,
            &image,
            &credentials,
            &placement,
        ),
        credentials: &credentials,
        features: &p.features,
        seed: p.seed.as_ref(),
        owner: Owner::Sandbox(ForSandbox {
            desired,
            provision: p,
            labels: &labels,
            network,
            reserved,
            claim: wanted.claim,
        }),
    };
    let up = start::run(
        &ctx.env,
        &ctx.sources,
        &job,
        &crate::domain::start::starts(wanted),
    )
    .await?;
    let (id, origin, seed_file) = (up.id.clone(), up.origin, up.source == Source::SeedFile);
    let status = ready_status(&ctx.env, engine, p, placement.host, credentials, up, &image).await;
    Ok((id, status, origin, seed_file))
}

/// The status of `up`, a container of `engine` that is ready, reached by
/// `host` on the sandbox's network (and `up.host_port` on the host), on
/// the node it runs on.
async fn ready_status(
    env: &Env,
    engine: &'static dyn Engine,
    p: &Provision,
    host: String,
    credentials: Credentials,
    up: Up,
    image: &str,
) -> ServiceStatus {
    let port = engine.port();
    #[cfg(any(test, feature = "simulation"))]
    let credentials =
        if crate::domain::mutation::on(crate::domain::mutation::Mutation::WrongPassword) {
            Credentials {
                password: crate::domain::secret::Secret::generate(),
                ..credentials
            }
        } else {
            credentials
        };
    ServiceStatus {
        url: engine.url(&host, port, &credentials),
        env: crate::engine::env_vars(engine, &env.config.env_prefix, &host, port, &credentials),
        host,
        port,
        host_port: up.host_port,
        user: credentials.user,
        password: credentials.password,
        database: credentials.database,
        available_extensions: up.available,
        instance: up.instance,
        ready_at: Some(env.clock.now()),
        heals: match (&p.reuse, p.reason) {
            (Some(s), ProvisionReason::Heal) => s.heals.saturating_add(1),
            (Some(s), _) => s.heals,
            (None, _) => 0,
        },
        image: image.to_owned(),
        node: node_of(env, &up.id).await,
        seed: p.seed.clone(),
    }
}

/// Checks, before anything is removed, that `image` and the daemon can
/// serve `p` (a rotation that cannot must not destroy the working
/// container); then, for a replace, that the row still wants it, and
/// removes the containers `p` replaces.
async fn make_room(
    env: &Env,
    desired: &DesiredSandbox,
    p: &Provision,
    image: &str,
) -> Result<(), ProvisionError> {
    ships_features(env.runtime.as_ref(), p, image).await?;
    let isolation = desired.isolation_under(env.config.isolation);
    runtime_registered(env.runtime.as_ref(), isolation).await?;
    if p.reason == ProvisionReason::Replace && !p.replace.is_empty() {
        still_wanted(env, desired, p).await?;
    }
    for id in &p.replace {
        env.runtime.remove(id, env.config.stop_timeout).await?;
    }
    Ok(())
}

/// What the start choice weighs for `p`'s container of `desired`.
fn wanted(env: &Env, desired: &DesiredSandbox, p: &Provision) -> Wanted {
    Wanted {
        claim: claim_kind(
            p.reason,
            desired.own_data(),
            p.retire.is_some(),
            pool::same_isolation(env, desired),
        ),
        fork: desired.fork_of.is_some(),
        seeded: p.seed.is_some(),
        persistent: desired.persistent,
    }
}

/// The labels of `p`'s new container of `desired`, with the token
/// `instance`.
fn labels_of(
    env: &Env,
    desired: &DesiredSandbox,
    p: &Provision,
    instance: String,
) -> ContainerLabels {
    ContainerLabels {
        deployment: env.config.deployment.clone(),
        sandbox: desired.id.clone(),
        owner: desired.owner.clone(),
        engine: p.engine.as_str().to_owned(),
        generation: desired.generation,
        features: p.features.clone(),
        instance,
        // Read by the reconcile before anything is planned.
        state_id: env.state.get().map(ToString::to_string),
        incarnation: desired.incarnation.as_ref().map(ToString::to_string),
        isolation: desired.isolation_under(env.config.isolation),
        seed: p.seed.clone(),
    }
}

/// The container `p` starts for `desired`, built from its `labels`, at
/// its `placement` on the sandbox's network (a rotation's candidate under
/// a name of its own and without the engine's alias), on the sandbox's
/// volume if it is persistent, under its isolation level's runtime,
/// labelled with the term that made it.
#[allow(clippy::too_many_arguments)]
fn spec_of(
    env: &Env,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    labels: &ContainerLabels,
    image: &str,
    credentials: &Credentials,
    placement: &Placement,
) -> ContainerSpec {
    let config = &env.config;
    let mut build = placement.clone();
    if p.retire.is_some() {
        build.container = candidate_name(&build.container, &labels.instance);
        build.aliases = Vec::new();
    }
    let volume = desired
        .persistent
        .then(|| volume::data_volume(config, labels, engine));
    let mut spec = container_spec(
        config,
        engine,
        &build,
        image,
        credentials,
        &p.features,
        labels.to_map(),
        volume,
    );
    spec.host_port = p.host_port;
    spec.runtime = labels.isolation.runtime().map(str::to_owned);
    if let Some(term) = env.fence.term() {
        spec.labels
            .insert(crate::domain::lease::TERM_LABEL.into(), term.to_string());
    }
    spec
}

/// Reads the row again before a replace removes the running container it
/// was planned against ([`recheck`]).
async fn still_wanted(
    env: &Env,
    desired: &DesiredSandbox,
    p: &Provision,
) -> Result<(), ProvisionError> {
    match recheck::since(env, desired).await {
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
    runtime: &(impl Host + ?Sized),
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
    runtime: &(impl Images + ?Sized),
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

/// The Swarm node the engine `id` runs on, for its status; not knowing
/// it fails nothing (the status then does not name one).
pub(crate) async fn node_of(env: &Env, id: &ContainerId) -> Option<String> {
    match env.runtime.node_of(id).await {
        Ok(node) => node,
        Err(e) => {
            tracing::debug!(container = %id, error = %e, "the engine's node is unknown");
            None
        }
    }
}
