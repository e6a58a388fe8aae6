//! Creating one engine container and bringing it to ready: image, container
//! with caps and labels, readiness, features, verification.

use crate::config::{ControllerConfig, ProbeVia};
use crate::engine::{self, Credentials, Engine, EngineError, Target};
use crate::labels::ContainerLabels;
use crate::metrics::Metrics;
use crate::model::{DesiredSandbox, ServiceStatus};
use crate::runtime::{self, ContainerSpec, RuntimeError};
use crate::secret::Secret;
use bollard::Docker;
use rand::distr::{Alphanumeric, SampleString};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// Why provisioning one engine failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Docker refused or failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The container exited while sandboxd waited for it.
    #[error(
        "{engine} container {container} exited before it became ready; last log lines:\n{logs}"
    )]
    Exited {
        /// Engine name.
        engine: &'static str,
        /// Container name.
        container: String,
        /// Tail of its output, credentials scrubbed.
        logs: String,
    },
    /// The engine did not answer in time.
    #[error("{engine} container {container} did not become ready within {waited:?} ({last}); last log lines:\n{logs}")]
    NotReady {
        /// Engine name.
        engine: &'static str,
        /// Container name.
        container: String,
        /// How long sandboxd waited.
        waited: Duration,
        /// The last probe error.
        last: String,
        /// Tail of its output, credentials scrubbed.
        logs: String,
    },
    /// The image could not be pulled and the build command failed.
    #[error("image {image} could not be pulled, and building it failed: {reason}; check --image-build-command")]
    Build {
        /// The image reference.
        image: String,
        /// What went wrong.
        reason: String,
    },
    /// Enabling or verifying features failed.
    #[error("{0} (image {1})")]
    Feature(#[source] EngineError, String),
}

/// The container name for one engine of one sandbox.
pub fn container_name(config: &ControllerConfig, desired_id: &str, engine: &str) -> String {
    format!("sandboxd-{}-{desired_id}-{engine}", config.deployment)
}

/// A fresh credential-set token (see [`crate::labels::INSTANCE`]).
fn new_instance() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), 16)
}

/// The container sandboxd creates for `engine`: the image's environment
/// contract, caps, tmpfs data, loopback port and the configured network.
pub fn container_spec(
    config: &ControllerConfig,
    engine: &'static dyn Engine,
    name: &str,
    image: &str,
    credentials: &Credentials,
    labels: std::collections::HashMap<String, String>,
) -> ContainerSpec {
    ContainerSpec {
        name: name.to_owned(),
        image: image.to_owned(),
        env: engine.container_env(credentials),
        cmd: engine.container_args(credentials),
        labels,
        port: engine.port(),
        host_port: None,
        network: config.network.clone(),
        limits: config.limits,
        tmpfs_path: engine.data_path().to_owned(),
        cap_add: engine
            .capabilities()
            .iter()
            .map(|c| c.to_string())
            .collect(),
    }
}

/// Makes sure `image` is present: used if it is, else pulled, else (when
/// `--image-build-command` is set) built by that command and used if it
/// then exists. Counts pulls and builds.
async fn ensure_image(
    docker: &Docker,
    config: &ControllerConfig,
    metrics: &Metrics,
    image: &str,
) -> Result<(), ProvisionError> {
    let pull_error = match runtime::ensure_image(docker, image, config.pull_timeout).await {
        Ok(false) => return Ok(()),
        Ok(true) => {
            metrics.image_pulls.with_label_values(&["success"]).inc();
            return Ok(());
        }
        Err(e) => {
            metrics.image_pulls.with_label_values(&["error"]).inc();
            e
        }
    };
    let Some(command) = &config.image_build_command else {
        return Err(pull_error.into());
    };
    tracing::info!(
        image,
        command = command.as_str(),
        "image cannot be pulled; building it"
    );
    let built = build_image(command, image, config.build_timeout).await;
    let present = runtime::image_exists(docker, image).await.unwrap_or(false);
    let outcome = match built {
        Ok(()) if present => Ok(()),
        Ok(()) => Err(format!(
            "{command:?} succeeded but did not produce the image"
        )),
        Err(reason) => Err(reason),
    };
    let result = if outcome.is_ok() { "success" } else { "error" };
    metrics.image_builds.with_label_values(&[result]).inc();
    outcome.map_err(|reason| ProvisionError::Build {
        image: image.to_owned(),
        reason,
    })
}

/// Runs the build command (`sh -c COMMAND sh IMAGE`, with `SANDBOXD_IMAGE`
/// set too) within `timeout`; its output goes to sandboxd's stderr.
async fn build_image(command: &str, image: &str, timeout: Duration) -> Result<(), String> {
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command, "sh", image])
        .env("SANDBOXD_IMAGE", image)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!("{command:?} failed with {status}")),
        Ok(Err(e)) => Err(format!("waiting for {command:?} failed: {e}")),
        Err(_) => Err(format!("{command:?} did not finish within {timeout:?}")),
    }
}

/// What to provision.
pub struct Request<'a> {
    /// The desired row.
    pub desired: &'a DesiredSandbox,
    /// The engine.
    pub engine: &'static dyn Engine,
    /// Features to enable.
    pub features: &'a BTreeSet<String>,
    /// Credentials to keep (heal), or `None` for fresh ones.
    pub reuse: Option<&'a ServiceStatus>,
    /// Host port to try to keep.
    pub host_port: Option<u16>,
    /// Containers to remove first.
    pub replace: &'a [String],
}

/// Provisions one engine container and returns its published status.
/// On failure the new container is removed, so nothing leaks.
pub async fn provision(
    docker: &Docker,
    config: &ControllerConfig,
    metrics: &Metrics,
    req: Request<'_>,
) -> Result<ServiceStatus, ProvisionError> {
    let engine = req.engine;
    let image = config.images.image_for(engine, !req.features.is_empty());
    ensure_image(docker, config, metrics, &image).await?;

    let credentials = match req.reuse {
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
    for id in req.replace {
        runtime::remove(docker, id, config.stop_timeout).await?;
    }

    let name = container_name(config, req.desired.id.as_str(), engine.name());
    let labels = ContainerLabels {
        deployment: config.deployment.clone(),
        sandbox: req.desired.id.clone(),
        owner: req.desired.owner.clone(),
        engine: engine.name().to_owned(),
        generation: req.desired.generation,
        features: req.features.clone(),
        instance: instance.clone(),
    };
    let mut spec = container_spec(config, engine, &name, &image, &credentials, labels.to_map());
    spec.host_port = req.host_port;
    let id = match runtime::create_and_start(docker, &spec).await {
        Ok(id) => id,
        Err(e) if spec.host_port.is_some() => {
            // The old host port may be taken by now: take any port rather
            // than fail (the status publishes the new one).
            tracing::warn!(container = %name, error = %e, "could not keep the host port; using a new one");
            spec.host_port = None;
            runtime::create_and_start(docker, &spec).await?
        }
        Err(e) => return Err(e.into()),
    };

    let result = bring_up(
        docker,
        config,
        engine,
        &id,
        &name,
        &credentials,
        req.features,
        &image,
    )
    .await;
    match result {
        Ok((host_port, available)) => {
            let host = name.clone();
            let port = engine.port();
            Ok(ServiceStatus {
                url: engine.url(&host, port, &credentials),
                env: engine::env_vars(engine, &config.env_prefix, &host, port, &credentials),
                host,
                port,
                host_port,
                user: credentials.user,
                password: credentials.password,
                database: credentials.database,
                available_extensions: available,
                instance,
            })
        }
        Err(e) => {
            if let Err(cleanup) = runtime::remove(docker, &id, Duration::ZERO).await {
                tracing::warn!(container = %name, error = %cleanup, "could not remove the failed container; the next reconcile will");
            }
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn bring_up(
    docker: &Docker,
    config: &ControllerConfig,
    engine: &'static dyn Engine,
    id: &str,
    name: &str,
    credentials: &Credentials,
    features: &BTreeSet<String>,
    image: &str,
) -> Result<(u16, Vec<String>), ProvisionError> {
    let host_port = runtime::published_port(docker, id).await?.unwrap_or(0);
    let (host, port) = match config.probe_via {
        ProbeVia::Host => ("127.0.0.1".to_owned(), host_port),
        ProbeVia::Network => (name.to_owned(), engine.port()),
    };
    let target = Target {
        host: &host,
        port,
        container_id: id,
        docker,
        credentials,
    };
    wait_ready(docker, engine, &target, name).await?;
    if features.is_empty() {
        // Nothing to enable or verify: spare the engine two more logins.
        return Ok((host_port, Vec::new()));
    }
    engine
        .enable_features(&target, features)
        .await
        .map_err(|e| ProvisionError::Feature(e, image.to_owned()))?;
    let available = engine
        .verify_features(&target, features)
        .await
        .map_err(|e| ProvisionError::Feature(e, image.to_owned()))?;
    Ok((host_port, available))
}

/// Polls the engine's probe until it passes (returning how many probes
/// failed first), the container exits, or the engine's deadline passes.
pub async fn wait_ready(
    docker: &Docker,
    engine: &'static dyn Engine,
    target: &Target<'_>,
    name: &str,
) -> Result<u32, ProvisionError> {
    let started = Instant::now();
    let deadline = started + engine.readiness_deadline();
    let mut delay = Duration::from_millis(50);
    let mut attempts = 0u32;
    loop {
        let last = match engine.probe(target).await {
            Ok(()) => {
                tracing::debug!(
                    container = name,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    attempts,
                    "engine ready"
                );
                return Ok(attempts);
            }
            Err(e) => e.to_string(),
        };
        attempts += 1;
        if attempts % 5 == 0
            && runtime::is_running(docker, target.container_id).await? != Some(true)
        {
            return Err(ProvisionError::Exited {
                engine: engine.name(),
                container: name.to_owned(),
                logs: scrubbed_logs(docker, target).await,
            });
        }
        if Instant::now() >= deadline {
            return Err(ProvisionError::NotReady {
                engine: engine.name(),
                container: name.to_owned(),
                waited: started.elapsed(),
                last: scrub(&last, target.credentials),
                logs: scrubbed_logs(docker, target).await,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

fn scrub(text: &str, credentials: &Credentials) -> String {
    text.replace(credentials.password.expose(), "***")
}

async fn scrubbed_logs(docker: &Docker, target: &Target<'_>) -> String {
    let logs = runtime::logs_tail(docker, target.container_id, 15).await;
    scrub(&logs, target.credentials)
}
