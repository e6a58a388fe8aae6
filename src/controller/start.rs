//! The one executor of every start of an engine's container: a sandbox's
//! create, heal, rotation and fork, and a warm pool's fill. The starts to
//! try come from the pure choice ([`crate::domain::start`]); this module
//! tries them in order. Each source offers what it has ([`offer`]): a
//! claimed pool container that is ready already, a volume to start from
//! (a fork's copy, a seed's data file or template) or the engine's
//! template, or nothing (the next start is tried). The container is then
//! created from the spec built once from its labels, the source's mounts
//! added to a copy of it, and brought up; then the steps after ready:
//! the seed loaded where the data does not have it yet, and a pool's
//! container copied into its seed's template. A source whose start failed
//! forgets what it offered ([`forget`]), so the next container does not
//! trip over it. Sources do not call each other: only this module knows
//! the order.

use super::bring_up::{bring_up, new_instance, ProvisionError};
use super::env::Env;
use super::pool::claim::{self, Claim, Claimant};
use super::pool::{Pool, Reserved};
use super::{fork, image, network, seed, seed_template, template};
use crate::domain::event::Origin;
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::labels::{ContainerLabels, INSTANCE};
use crate::domain::plan::Provision;
use crate::domain::pool::ClaimKind;
use crate::domain::sandbox::DesiredSandbox;
use crate::domain::seed::SeedHash;
use crate::domain::start::{self, Source, Start};
use crate::domain::template_volume::Refusal;
use crate::engine::{Credentials, Engine};
use crate::ports::runtime::{ContainerSpec, RuntimeError};
use std::collections::BTreeSet;
use std::time::Duration;

/// What the starts draw from, each ledger kept by its source: the warm
/// pool's containers, the seeds read and their templates, the engines'
/// templates, the sources being copied for a fork, and the images being
/// fetched.
pub(crate) struct Sources {
    /// The warm pool (empty unless configured).
    pub(crate) pool: Pool,
    /// Seed content read so far.
    pub(crate) seeds: seed::Seeds,
    /// Pre-initialised templates.
    pub(crate) templates: template::Templates,
    /// The sources whose data is being copied for a fork now.
    pub(crate) forks: fork::Copies,
    /// Absent images being pulled or built in the background.
    pub(crate) images: std::sync::Arc<image::Fetches>,
}

/// A container to start: what is the same whichever source it starts
/// from.
pub(crate) struct Job<'a> {
    /// Its engine.
    pub(crate) engine: &'static dyn Engine,
    /// The container, built once from its labels; a source only adds its
    /// mounts, to a copy.
    pub(crate) spec: ContainerSpec,
    /// The login its engine is brought up (and its seed loaded) with.
    pub(crate) credentials: &'a Credentials,
    /// The features enabled and checked once it is ready.
    pub(crate) features: &'a BTreeSet<String>,
    /// The seed its data starts from, if any.
    pub(crate) seed: Option<&'a SeedHash>,
    /// Whose container it is.
    pub(crate) owner: Owner<'a>,
}

/// Whose container a start makes.
pub(crate) enum Owner<'a> {
    /// A sandbox's: created on its network (made again if it is gone).
    Sandbox(ForSandbox<'a>),
    /// A warm pool's, on the pool network made for it. A seed loaded into
    /// it is copied into the seed's template before it is offered.
    Pool,
}

/// What a sandbox's start knows besides the container.
pub(crate) struct ForSandbox<'a> {
    /// The row.
    pub(crate) desired: &'a DesiredSandbox,
    /// The planned provision.
    pub(crate) provision: &'a Provision,
    /// The container's labels (a fork's copy is labelled alike).
    pub(crate) labels: &'a ContainerLabels,
    /// The sandbox's network.
    pub(crate) network: &'a str,
    /// The warm-pool containers the reconcile reserved.
    pub(crate) reserved: &'a Reserved<'a>,
    /// Whether (and as which kind) a pool container may serve it.
    pub(crate) claim: Option<ClaimKind>,
}

/// A container that came up.
#[derive(Debug)]
pub(crate) struct Up {
    /// Its id.
    pub(crate) id: ContainerId,
    /// The host port its engine port is published on.
    pub(crate) host_port: u16,
    /// The features it has.
    pub(crate) available: Vec<String>,
    /// The credential-set token it carries, which its status publishes.
    pub(crate) instance: String,
    /// The source it started from.
    pub(crate) source: Source,
    /// What it is counted and reported as.
    pub(crate) origin: Origin,
}

/// What a source offers one start.
enum Offer {
    /// A container that is ready already: a claimed pool container.
    Ready(Up),
    /// Its mounts, added to the start's spec.
    Mounted,
    /// A ready container it tried to hand over, and failed: a claim.
    Failed,
    /// Nothing now (and, for the engine's template, why it was refused).
    Nothing(Option<Refusal>),
}

/// Tries `starts` in order until a container is up; a sandbox's new
/// container is counted by where it came from (a claimed one is counted
/// as a claim, by the pool).
///
/// A start that failed may leave its container behind (its removal can
/// fail too, and a claim's rename can land after it gave up), so the
/// next start carries a credential-set token of its own: the one left
/// behind is never taken for the container whose status is published
/// (simulation seed 9428).
pub(crate) async fn run(
    env: &Env,
    sources: &Sources,
    job: &Job<'_>,
    starts: &[Start],
) -> Result<Up, ProvisionError> {
    let mut refused = None;
    let mut failed = None;
    let mut token = None;
    for start in starts {
        let mut spec = job.spec.clone();
        if let Some(token) = &token {
            spec.labels
                .insert(INSTANCE.to_owned(), String::clone(token));
        }
        match offer(env, sources, job, start.source, &mut spec).await? {
            Offer::Ready(up) => return Ok(up),
            Offer::Failed => {
                token = Some(new_instance());
                continue;
            }
            Offer::Nothing(refusal) => {
                refused = refused.or(refusal);
                continue;
            }
            Offer::Mounted => {}
        }
        let result = create(env, &sources.seeds, job, &mut spec, start.load_seed).await;
        let e = match result {
            Ok((id, host_port, available)) => {
                let (source, origin) = (start.source, start::origin(start.source, refused));
                if let Owner::Sandbox(s) = &job.owner {
                    (env.metrics.lifecycle).container_started(s.provision.engine, origin.as_str());
                }
                return Ok(Up {
                    id,
                    host_port,
                    available,
                    instance: instance_of(&spec),
                    source,
                    origin,
                });
            }
            Err(e) => e,
        };
        // A container killed from outside says nothing of its source; a
        // seed that failed to load would fail from the next one too.
        if matches!(e, ProvisionError::Interrupted(_) | ProvisionError::Seed(_)) {
            return Err(e);
        }
        forget(env, sources, job, start.source, &spec).await;
        if !start.falls_back {
            return Err(e);
        }
        tracing::warn!(container = spec.name, source = ?start.source, error = %e, "the engine did not start from its source; trying the next");
        token = Some(new_instance());
        failed = Some(e);
    }
    Err(failed.unwrap_or(ProvisionError::NothingToStart(job.engine.name())))
}

/// What `source` offers the start of `spec`: its mounts added to it, or a
/// ready container.
async fn offer(
    env: &Env,
    sources: &Sources,
    job: &Job<'_>,
    source: Source,
    spec: &mut ContainerSpec,
) -> Result<Offer, ProvisionError> {
    let sandbox = match &job.owner {
        Owner::Sandbox(s) => Some(s),
        Owner::Pool => None,
    };
    let image = spec.image.clone();
    let volume = match (source, sandbox) {
        (Source::Pool, Some(s)) => return Ok(claim(env, sources, job, s, spec).await),
        (Source::Fork, Some(s)) => {
            let (desired, p, labels) = (s.desired, s.provision, s.labels);
            fork::prepare(
                env,
                &sources.pool,
                &sources.forks,
                desired,
                job.engine,
                p,
                labels,
                &image,
                job.credentials,
            )
            .await?
        }
        (Source::Pool | Source::Fork, None) => None,
        (Source::SeedFile, _) => match job.seed {
            Some(hash) => seed::data_file(env, &sources.seeds, job.engine, &image, hash).await?,
            None => None,
        },
        (Source::SeedTemplate, _) => match seed_kind(job, &image) {
            Some(kind) => seed_template::ready(env, &sources.seeds, &kind).await,
            None => None,
        },
        (Source::Template, _) => {
            let refusal =
                template::apply_or_refusal(env, &sources.templates, job.engine, job.features, spec)
                    .await;
            return Ok(match spec.template {
                Some(_) => Offer::Mounted,
                None => Offer::Nothing(refusal),
            });
        }
        (Source::Cold, _) => return Ok(Offer::Mounted),
    };
    Ok(match volume {
        Some(volume) => {
            template::start_from(spec, volume);
            Offer::Mounted
        }
        None => Offer::Nothing(None),
    })
}

/// The ready pool container the reconcile reserved, claimed for the
/// sandbox under `spec`'s token; nothing if there is none or the sandbox
/// may not claim.
async fn claim(
    env: &Env,
    sources: &Sources,
    job: &Job<'_>,
    s: &ForSandbox<'_>,
    spec: &ContainerSpec,
) -> Offer {
    let Some(kind) = s.claim else {
        return Offer::Nothing(None);
    };
    let instance = instance_of(spec);
    let claimant = Claimant {
        desired: s.desired,
        engine: job.engine,
        provision: s.provision,
        credentials: job.credentials,
        instance: &instance,
        image: &spec.image,
        network: s.network,
        kind,
    };
    match claim::claim(env, &sources.pool, &claimant, s.reserved).await {
        Claim::Claimed(c) => Offer::Ready(Up {
            id: c.id,
            host_port: c.host_port,
            available: c.available,
            instance,
            source: Source::Pool,
            origin: Origin::Pool,
        }),
        Claim::Failed => Offer::Failed,
        Claim::NoneReserved => Offer::Nothing(None),
    }
}

/// The credential-set token `spec`'s labels give its container.
fn instance_of(spec: &ContainerSpec) -> String {
    spec.labels.get(INSTANCE).cloned().unwrap_or_default()
}

/// What a seeded template of the job's container is made for.
fn seed_kind<'a>(job: &'a Job<'_>, image: &'a str) -> Option<seed_template::Kind<'a>> {
    Some(seed_template::Kind {
        engine: job.engine,
        image,
        features: job.features,
        hash: job.seed?,
    })
}

/// Forgets what `source` offered a start that failed: a seed's data
/// file, a seed's template or the engine's template that does not start
/// the engine (removed or damaged behind this process's back: by an
/// operator, or by another leader's collection while this one stood by;
/// under Swarm, a node its job has not reached) is made again rather
/// than tried by the next container.
async fn forget(env: &Env, sources: &Sources, job: &Job<'_>, source: Source, spec: &ContainerSpec) {
    match source {
        Source::SeedTemplate | Source::SeedFile => {
            if let Some(volume) = &spec.start_from {
                seed::forget(&sources.seeds, volume);
            }
        }
        Source::Template => {
            if let Some(t) = &spec.template {
                sources.templates.forget(&t.name);
            }
            // Forgotten, the template's job starts again now, beside the
            // next start, rather than at the next sandbox of its kind.
            let _ = template::for_container(
                env,
                &sources.templates,
                job.engine,
                &spec.image,
                job.features,
            )
            .await;
        }
        Source::Pool | Source::Fork | Source::Cold => {}
    }
}

/// Creates `spec`'s container and brings its engine up, then the steps
/// after ready (the seed loaded if `load_seed`; a pool's container then
/// copied into its seed's template): its id, host port and available
/// features. A container that does not come up is removed (the next
/// reconcile removes it if that fails).
async fn create(
    env: &Env,
    seeds: &seed::Seeds,
    job: &Job<'_>,
    spec: &mut ContainerSpec,
    load_seed: bool,
) -> Result<(ContainerId, u16, Vec<String>), ProvisionError> {
    let id = match &job.owner {
        Owner::Sandbox(s) => on_sandbox_network(env, &s.desired.id, spec).await?,
        Owner::Pool => env.runtime.create_and_start(spec).await?,
    };
    let name = spec.name.as_str();
    let up = async {
        let (host_port, available) = bring_up(
            env,
            job.engine,
            &id,
            name,
            job.credentials,
            job.features,
            &spec.image,
        )
        .await?;
        #[cfg(any(test, feature = "simulation"))]
        let load_seed =
            load_seed && !crate::domain::mutation::on(crate::domain::mutation::Mutation::SkipSeed);
        if let Some(hash) = job.seed.filter(|_| load_seed) {
            seed::load(
                env,
                seeds,
                job.engine,
                &id,
                name,
                host_port,
                job.credentials,
                hash,
            )
            .await?;
            if let (Owner::Pool, Some(kind)) = (&job.owner, seed_kind(job, &spec.image)) {
                seed_template::capture(env, seeds, &kind, &id, job.credentials).await;
            }
        }
        Ok::<_, ProvisionError>((host_port, available))
    };
    match up.await {
        Ok((host_port, available)) => Ok((id, host_port, available)),
        Err(e) => {
            let e = e.interrupted_if(|c| env.orders.of(c).is_some());
            if let Err(cleanup) = env.runtime.remove(&id, Duration::ZERO).await {
                tracing::warn!(container = name, error = %cleanup, "could not remove the failed container; the next reconcile will");
            }
            Err(e)
        }
    }
}

/// Creates and starts a sandbox's container on its network: on any host
/// port if the one it should keep is taken by now (its status publishes
/// the new one).
async fn on_sandbox_network(
    env: &Env,
    sandbox: &SandboxId,
    spec: &mut ContainerSpec,
) -> Result<ContainerId, ProvisionError> {
    match network::create_and_start(env, sandbox, spec).await {
        Ok(id) => Ok(id),
        // A removal that did not end is not cured by another port.
        Err(e) if spec.host_port.is_some() && !matches!(e, RuntimeError::NameStillHeld { .. }) => {
            tracing::warn!(container = spec.name, error = %e, "could not keep the host port; using a new one");
            spec.host_port = None;
            Ok(network::create_and_start(env, sandbox, spec).await?)
        }
        Err(e) => Err(e.into()),
    }
}
