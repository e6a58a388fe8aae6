//! Pre-initialised templates: per engine image and feature set, a volume
//! holding an initialised data directory (the features' extensions
//! created, no credential at all), filled once by a template job in the
//! background and mounted read-only into each new container of that image
//! and feature set, whose entrypoint copies it into its tmpfs and sets the
//! sandbox's fresh password (the images' `SANDBOXD_TEMPLATE`).
//!
//! A sandbox never waits for a template: until its template is ready it
//! starts cold, as without templates. The volume's name carries the
//! image's id and the digest of the job's recipe, so an image or a
//! sandboxd that builds differently gets a new template; the old one is
//! removed after the new one is built, once no container mounts it.
//! Persistent sandboxes never use templates (their data is a volume).
//!
//! A template belongs to the deployment, not to the state database: a
//! controller on a recreated state database (another identity) reuses the
//! templates the previous one built when their labels prove the same
//! content, and replaces them when not (see
//! [`crate::domain::template_volume`]). A volume it may neither reuse nor
//! replace is *refused*: counted in `sandboxd_templates_refused`, alerted
//! on, and named in the events of the sandboxes that start cold for it.
//!
//! With the template, the job fills a second volume per image with the
//! image's binaries (the engine's [`Engine::binaries_dir`]), which the
//! containers mount read-only in their place: every container then shares
//! one page cache of them instead of holding its own copy (about 20 MiB
//! per Postgres container on fuse-overlayfs; docs/architecture.md,
//! "Density").

use super::env::Env;
use crate::config::ControllerConfig;
use crate::domain::id::EngineName;
use crate::domain::labels;
use crate::domain::template_volume::{self, Refusal, TEMPLATE_RECIPE};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::ports::runtime::{
    ContainerSpec, Runtime, RuntimeError, TemplateJob, Tmpfs, Volume, Volumes,
};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use crate::domain::template_volume::{TEMPLATE, TEMPLATE_BINARIES, TEMPLATE_IMAGE};

/// How long a failed template build is not tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// What is known of one template volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Its job runs.
    Building,
    /// Filled: containers may mount it.
    Ready,
    /// Its job failed; not tried again before then.
    Failed { retry_at: Instant },
    /// A volume under its name may be neither reused nor replaced; looked
    /// at again from then (an operator may have removed it).
    Refused { refusal: Refusal, retry_at: Instant },
}

/// What a lookup found (once per provision: its size does not matter).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Resolved {
    /// The template is ready: mount these.
    Ready(Mounts),
    /// Start cold: the template is being built, failed lately, or is off.
    Cold,
    /// Start cold: the template's volume is refused.
    Refused(Refusal),
}

/// The templates of this controller (memory only: after a restart, the
/// first sandbox of each kind runs the job again, which finds the volume
/// filled and exits at once).
pub(crate) struct Templates {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    /// One template job at a time: they compete with sandboxes for the CPU.
    jobs: Arc<Semaphore>,
}

impl Default for Templates {
    fn default() -> Self {
        Self {
            slots: Arc::default(),
            jobs: Arc::new(Semaphore::new(1)),
        }
    }
}

/// What a container started from a template mounts, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mounts {
    /// The initialised data directory.
    pub(crate) data: Volume,
    /// The image's binaries, if the engine shares them.
    pub(crate) binaries: Option<Volume>,
}

/// Which template a container would use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateKey {
    /// The engine.
    pub(crate) engine: EngineName,
    /// The image reference the container runs.
    pub(crate) image: String,
    /// That image's id.
    pub(crate) image_id: String,
    /// The features created in the template.
    pub(crate) features: BTreeSet<String>,
}

impl TemplateKey {
    /// The volume name: deployment, engine, features, a short image id and
    /// the job's `recipe` (see [`recipe`]), so it is the same in every
    /// process (whatever its state database) and new for a changed image
    /// or a sandboxd that builds templates differently.
    fn volume_name(&self, config: &ControllerConfig, recipe: &str) -> String {
        format!(
            "{}-{}.{recipe}",
            self.prefix(config),
            short_id(&self.image_id)
        )
    }

    /// What every template volume of this engine and feature set is
    /// called up to the image id.
    fn prefix(&self, config: &ControllerConfig) -> String {
        let features = if self.features.is_empty() {
            "plain".to_owned()
        } else {
            self.features.iter().cloned().collect::<Vec<_>>().join(".")
        };
        format!("{}-template-{}-{features}", config.deployment, self.engine)
    }

    /// The binaries volume's name: one per image (the plain one or the
    /// one with extensions), shared by its feature sets.
    fn binaries_name(&self, config: &ControllerConfig) -> String {
        format!(
            "{}-{}",
            self.binaries_prefix(config),
            short_id(&self.image_id)
        )
    }

    /// What every binaries volume of this engine's image kind is called
    /// up to the image id.
    fn binaries_prefix(&self, config: &ControllerConfig) -> String {
        let kind = if self.features.is_empty() {
            "plain"
        } else {
            "ext"
        };
        format!("{}-binaries-{}-{kind}", config.deployment, self.engine)
    }
}

/// The first 12 hex digits of an image id (`sha256:…`).
fn short_id(id: &str) -> String {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect()
}

impl Templates {
    /// [`Templates::resolve`]'s mounts, if any (for tests).
    #[cfg(test)]
    pub(crate) fn lookup(
        &self,
        env: &Env,
        engine: &'static dyn Engine,
        key: &TemplateKey,
    ) -> Option<Mounts> {
        match self.resolve(env, engine, key) {
            Resolved::Ready(mounts) => Some(mounts),
            Resolved::Cold | Resolved::Refused(_) => None,
        }
    }

    /// The template volumes a new container for `key` mounts, if they are
    /// ready; otherwise why it starts cold and, unless its job runs or
    /// failed (or was refused) recently, the job starts in the background.
    pub(crate) fn resolve(
        &self,
        env: &Env,
        engine: &'static dyn Engine,
        key: &TemplateKey,
    ) -> Resolved {
        let Some(mount) = engine.template_dir() else {
            return Resolved::Cold;
        };
        let volume = template_volume(env, engine, key, mount);
        let binaries = engine
            .binaries_dir()
            .map(|dir| binaries_volume(env, key, dir));
        let mut slots = self.slots.lock().unwrap();
        match slots.get(&volume.name) {
            Some(Slot::Ready) => {
                return Resolved::Ready(Mounts {
                    data: volume,
                    binaries,
                })
            }
            Some(Slot::Building) => return Resolved::Cold,
            Some(Slot::Failed { retry_at }) if Instant::now() < *retry_at => return Resolved::Cold,
            Some(Slot::Refused { refusal, retry_at }) if Instant::now() < *retry_at => {
                return Resolved::Refused(*refusal)
            }
            _ => {}
        }
        // A refused template stays counted as refused while its job looks
        // again, so that the metric does not flap.
        let refused = match slots.get(&volume.name) {
            Some(Slot::Refused { refusal, .. }) => Some(*refusal),
            _ => None,
        };
        if refused.is_none() {
            slots.insert(volume.name.clone(), Slot::Building);
        } else if let Some(Slot::Refused { retry_at, .. }) = slots.get_mut(&volume.name) {
            // Not looked at again until this job ends (it then records
            // what it found); the bound only matters should it never end.
            *retry_at = Instant::now() + RETRY_AFTER * 10;
        }
        drop(slots);
        let job = template_job(env, engine, key, volume, binaries);
        let prefixes = Prefixes {
            template: key.prefix(&env.config),
            binaries: key.binaries_prefix(&env.config),
        };
        tokio::spawn(build(
            self.slots.clone(),
            self.jobs.clone(),
            env.runtime.clone(),
            env.metrics.clone(),
            env.config.deployment.clone(),
            prefixes,
            engine.name(),
            job,
        ));
        refused.map_or(Resolved::Cold, Resolved::Refused)
    }

    /// Forgets a template that turned out to be gone or broken: the next
    /// container starts cold and the job runs again.
    pub(crate) fn forget(&self, volume: &str) {
        self.slots.lock().unwrap().remove(volume);
    }
}

/// Makes the new non-persistent container of `spec` (`engine` with
/// `features`) start from its template, if it is ready: mounts it and its
/// binaries, and tells the image's entrypoint (`SANDBOXD_TEMPLATE=use`).
/// Returns why the container starts cold if its template is refused (the
/// sandbox's event says so).
pub(crate) async fn apply_or_refusal(
    env: &Env,
    templates: &Templates,
    engine: &'static dyn Engine,
    features: &BTreeSet<String>,
    spec: &mut ContainerSpec,
) -> Option<Refusal> {
    match resolve(env, templates, engine, &spec.image, features).await {
        Resolved::Ready(mounts) => {
            spec.template = Some(mounts.data);
            spec.binaries = mounts.binaries;
            spec.env.push(USE.to_owned());
            None
        }
        Resolved::Cold => None,
        Resolved::Refused(refusal) => Some(refusal),
    }
}

/// What tells the image's entrypoint to start from the mounted template.
const USE: &str = "SANDBOXD_TEMPLATE=use";

/// Has the container start from the data in `volume` (a fork's copy of
/// its source's, see `controller::fork`; a seed's data file, see
/// `controller::seed`), as from a template.
pub(crate) fn start_from(spec: &mut ContainerSpec, volume: Volume) {
    spec.start_from = Some(volume);
    spec.env.push(USE.to_owned());
}

/// The template a new non-persistent container of `engine` from `image`
/// with `features` mounts: `None` when templates are off, the engine has
/// none, the image's id cannot be read, or the template is not ready yet
/// (its job then starts).
pub(crate) async fn for_container(
    env: &Env,
    templates: &Templates,
    engine: &'static dyn Engine,
    image: &str,
    features: &BTreeSet<String>,
) -> Option<Mounts> {
    match resolve(env, templates, engine, image, features).await {
        Resolved::Ready(mounts) => Some(mounts),
        Resolved::Cold | Resolved::Refused(_) => None,
    }
}

/// As [`for_container`], saying whether the template is refused.
async fn resolve(
    env: &Env,
    templates: &Templates,
    engine: &'static dyn Engine,
    image: &str,
    features: &BTreeSet<String>,
) -> Resolved {
    if !env.config.templates || engine.template_dir().is_none() {
        return Resolved::Cold;
    }
    let image_id = match env.runtime.image_id(image).await {
        Ok(Some(id)) => id,
        Ok(None) => return Resolved::Cold,
        Err(e) => {
            tracing::debug!(image, error = %e, "image id unreadable; starting cold");
            return Resolved::Cold;
        }
    };
    #[cfg(any(test, feature = "simulation"))]
    let features =
        &if crate::domain::mutation::on(crate::domain::mutation::Mutation::TemplateAnyFeatures) {
            BTreeSet::new()
        } else {
            features.clone()
        };
    let key = TemplateKey {
        engine: engine.name(),
        image: image.to_owned(),
        image_id,
        features: features.clone(),
    };
    templates.resolve(env, engine, &key)
}

/// Starts the jobs of the templates of every engine's plain image, so
/// that the first sandboxes need not start cold.
pub(crate) async fn prepare(env: &Env, templates: &Templates) {
    for engine in env.engines.iter() {
        let image = env.config.images.image_for(engine, false);
        let _ = for_container(env, templates, engine, &image, &BTreeSet::new()).await;
    }
}

/// The labels and mount of `key`'s binaries volume: the image's files
/// under `dir`.
fn binaries_volume(env: &Env, key: &TemplateKey, dir: &str) -> Volume {
    owned_volume(
        env,
        key.binaries_name(&env.config),
        dir,
        [
            (TEMPLATE_BINARIES.to_owned(), key.engine.to_string()),
            (TEMPLATE_IMAGE.to_owned(), key.image_id.clone()),
        ],
    )
}

/// The labels and mount of `key`'s volume. They say what it holds (image
/// id, features, recipe), which is all a controller of this deployment on
/// any state database needs to know to reuse it.
fn template_volume(
    env: &Env,
    engine: &'static dyn Engine,
    key: &TemplateKey,
    mount: &str,
) -> Volume {
    let recipe = recipe(engine, key, mount);
    owned_volume(
        env,
        key.volume_name(&env.config, &recipe),
        mount,
        [
            (TEMPLATE.to_owned(), key.engine.to_string()),
            (TEMPLATE_IMAGE.to_owned(), key.image_id.clone()),
            (
                labels::FEATURES.to_owned(),
                key.features.iter().cloned().collect::<Vec<_>>().join(","),
            ),
            (TEMPLATE_RECIPE.to_owned(), recipe),
        ],
    )
}

/// The digest of everything `key`'s job does besides its image: the
/// features, its environment and arguments, its user, where the template
/// is mounted, and the builder version. Same digest and image id, same
/// template: the job is deterministic given them (it holds no credential).
fn recipe(engine: &'static dyn Engine, key: &TemplateKey, mount: &str) -> String {
    let (env, cmd) = job_env_and_args(engine, key);
    let features = key.features.iter().cloned().collect::<Vec<_>>().join(",");
    let env = env.join("\n");
    let cmd = cmd.join("\n");
    template_volume::recipe([
        key.image_id.as_str(),
        features.as_str(),
        env.as_str(),
        cmd.as_str(),
        engine.user(),
        mount,
    ])
}

/// The template job's environment and arguments: the engine's
/// sandbox-mode ones with `SANDBOXD_TEMPLATE=build`, no password.
fn job_env_and_args(engine: &'static dyn Engine, key: &TemplateKey) -> (Vec<String>, Vec<String>) {
    // Only the user and database names are read from these; the password
    // is never sent (a template holds none).
    let names = engine.credentials(crate::domain::secret::Secret::generate());
    let mut env = engine.container_env(&names, &key.features, false);
    env.push("SANDBOXD_TEMPLATE=build".to_owned());
    (env, engine.container_args(&key.features, false))
}

/// A volume `name` mounted on `path`, labelled as this deployment's (and
/// this state database's, once known) with `kind` on top.
fn owned_volume<const N: usize>(
    env: &Env,
    name: String,
    path: &str,
    kind: [(String, String); N],
) -> Volume {
    let mut labels = HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            env.config.deployment.to_string(),
        ),
    ]);
    labels.extend(kind);
    if let Some(state) = env.state.get() {
        labels.insert(labels::STATE_ID.to_owned(), state.to_string());
    }
    Volume {
        name,
        path: path.to_owned(),
        labels,
        // A template's content is fixed by its recipe: nothing to cap.
        disk: None,
    }
}

/// The job that fills `volume` for `key`: the engine's sandbox-mode
/// environment and arguments with `SANDBOXD_TEMPLATE=build`, no password.
fn template_job(
    env: &Env,
    engine: &'static dyn Engine,
    key: &TemplateKey,
    volume: Volume,
    binaries: Option<Volume>,
) -> TemplateJob {
    let config = &env.config;
    let (env, cmd) = job_env_and_args(engine, key);
    let scratch = |path: &str| Tmpfs {
        path: path.to_owned(),
        bytes: config.limits.scratch_bytes,
    };
    let mut tmpfs = vec![scratch("/tmp")];
    tmpfs.extend(engine.runtime_dirs().iter().map(|d| scratch(d)));
    let mut job_labels = volume.labels.clone();
    job_labels.remove(TEMPLATE_IMAGE);
    job_labels.remove(TEMPLATE_RECIPE);
    TemplateJob {
        name: format!("{}-job", volume.name),
        image: key.image.clone(),
        env,
        cmd,
        labels: job_labels,
        user: engine.user().to_owned(),
        limits: config.limits,
        tmpfs,
        volume,
        binaries,
    }
}

/// The name prefixes of a template's volumes of other images (see
/// [`prune`]).
struct Prefixes {
    template: String,
    binaries: String,
}

/// Runs `job` (one at a time), records the outcome, and removes the
/// templates of the same engine and features built from other images.
#[allow(clippy::too_many_arguments)]
async fn build(
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    jobs: Arc<Semaphore>,
    runtime: Arc<dyn Runtime>,
    metrics: Arc<Metrics>,
    deployment: crate::domain::id::Deployment,
    prefixes: Prefixes,
    engine: EngineName,
    job: TemplateJob,
) {
    let Ok(_permit) = jobs.acquire().await else {
        return;
    };
    let name = job.volume.name.clone();
    let started = Instant::now();
    let outcome = runtime.run_template_job(&job).await;
    metrics.images.template_built(engine, outcome.is_ok());
    let slot = match &outcome {
        Ok(()) => {
            tracing::info!(
                template = %name,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "template ready"
            );
            Slot::Ready
        }
        Err(RuntimeError::TemplateRefused { refusal, .. }) => {
            // Counted and alerted on (SandboxdTemplateRefused), and named
            // in the events of the sandboxes that start cold for it.
            tracing::warn!(template = %name, reason = refusal.as_str(), error = %outcome.as_ref().unwrap_err(), "template refused; its sandboxes start cold");
            Slot::Refused {
                refusal: *refusal,
                retry_at: Instant::now() + RETRY_AFTER,
            }
        }
        Err(e) => {
            tracing::warn!(template = %name, error = %e, "template build failed; sandboxes start cold");
            Slot::Failed {
                retry_at: Instant::now() + RETRY_AFTER,
            }
        }
    };
    let (ready, refused) = {
        let mut slots = slots.lock().unwrap();
        slots.insert(name.clone(), slot);
        let ready = slots.values().filter(|s| **s == Slot::Ready).count();
        let refused = Refusal::ALL.map(|r| {
            let n = slots
                .values()
                .filter(|s| matches!(s, Slot::Refused { refusal, .. } if *refusal == r))
                .count();
            (r, n)
        });
        (ready, refused)
    };
    metrics.images.templates_ready(ready);
    metrics.images.templates_refused(&refused);
    if let (Err(e), Some(binaries)) = (&outcome, &job.binaries) {
        if !matches!(
            e,
            RuntimeError::TemplateJob { .. } | RuntimeError::TemplateRefused { .. }
        ) {
            // The job never ran: Docker may have left the binaries half
            // copied, and it fills only an empty volume. Unless a running
            // container uses it, it goes, to be filled again at the retry.
            if runtime
                .remove_volume(&binaries.name, &deployment, None)
                .await
                .is_ok()
            {
                tracing::info!(volume = %binaries.name, "removed the binaries of a template job that did not run");
            }
        }
    }
    if outcome.is_ok() {
        prune(runtime.as_ref(), &deployment, &prefixes.template, &name).await;
        if let Some(binaries) = &job.binaries {
            prune(
                runtime.as_ref(),
                &deployment,
                &prefixes.binaries,
                &binaries.name,
            )
            .await;
        }
    }
}

/// Removes this deployment's template volumes called `prefix-…` but not
/// `keep`: those of an older image. One still mounted is left for the
/// next build of its kind.
async fn prune(
    runtime: &(impl Volumes + ?Sized),
    deployment: &crate::domain::id::Deployment,
    prefix: &str,
    keep: &str,
) {
    let Ok(volumes) = runtime.volumes(deployment).await else {
        return;
    };
    let stale = volumes.into_iter().filter(|v| {
        v.sandbox.is_none()
            && v.name != keep
            && v.name
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('-') && !rest[1..].contains('-'))
    });
    for volume in stale {
        match runtime.remove_volume(&volume.name, deployment, None).await {
            Ok(()) => {
                tracing::info!(template = %volume.name, "removed the template of an older image")
            }
            Err(e) => {
                tracing::debug!(template = %volume.name, error = %e, "an older template is still in use")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_volume_is_named_by_deployment_engine_features_and_image() {
        let config = ControllerConfig::new("ci".parse().unwrap());
        let key = TemplateKey {
            engine: EngineName::of_engine("postgres"),
            image: "sandboxd/postgres-ext:17".into(),
            image_id: "sha256:3e6d1f6a4780aaaabbbbcccc".into(),
            features: ["vector".to_owned(), "citext".to_owned()].into(),
        };
        assert_eq!(
            key.volume_name(&config, "0123456789ab"),
            "ci-template-postgres-citext.vector-3e6d1f6a4780.0123456789ab"
        );
        let plain = TemplateKey {
            features: BTreeSet::new(),
            ..key.clone()
        };
        assert_eq!(
            plain.volume_name(&config, "0123456789ab"),
            "ci-template-postgres-plain-3e6d1f6a4780.0123456789ab"
        );
        // The recipe is fixed by the key (no password, nothing random) and
        // differs by feature set.
        let postgres = crate::engine::lookup("postgres").unwrap();
        let mount = postgres.template_dir().unwrap();
        assert_eq!(recipe(postgres, &key, mount), recipe(postgres, &key, mount));
        assert_ne!(
            recipe(postgres, &key, mount),
            recipe(postgres, &plain, mount)
        );
    }
}
