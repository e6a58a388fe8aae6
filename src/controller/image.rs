//! Engine images: an absent image is fetched in the background, never in
//! a worker slot: pulled, else (when `--image-build-command` is set) built
//! by that command. One fetch per image, however many sandboxes wait for
//! it; a reconcile that finds its image absent starts or joins that fetch
//! and returns at once, and the sandboxes that waited are enqueued again
//! when it ends. Pulls and builds are counted.
//!
//! sandboxd's own images (`sandboxd/…`, see [`own_image`]) are never
//! pulled: anyone may publish under that name on Docker Hub. An absent one
//! goes straight to the build command, or fails saying how to build it.

use crate::config::ControllerConfig;
use crate::domain::id::SandboxId;
use crate::domain::own_image::{self, OwnImageError};
use crate::metrics::Metrics;
use crate::ports::runtime::{Images, Runtime, RuntimeError};
use crate::sched::WorkQueue;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Why an image could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image is absent and the pull failed (no build command is set).
    #[error(transparent)]
    Unavailable(#[from] RuntimeError),
    /// One of sandboxd's own images is absent (never pulled) and no build
    /// command is set.
    #[error(transparent)]
    Own(#[from] OwnImageError),
    /// The image could not be pulled (or is sandboxd's own, never pulled)
    /// and the build command failed.
    #[error(
        "image {image} is absent, and building it failed: {reason}; check --image-build-command"
    )]
    Build {
        /// The image reference.
        image: String,
        /// What went wrong.
        reason: String,
    },
    /// The image was there when the reconcile began and is gone now.
    #[error("image {0} vanished while sandboxd was about to use it (removed or pruned?); it is fetched again at the next try")]
    Vanished(String),
    /// The background fetch ended without an answer.
    #[error("fetching image {0} ended unexpectedly; it is fetched again at the next try")]
    Lost(String),
}

/// The labels of `image`, which must be present (see [`Fetches::need`]).
pub(crate) async fn labels(
    runtime: &(impl Images + ?Sized),
    image: &str,
) -> Result<HashMap<String, String>, ImageError> {
    runtime
        .image_labels(image)
        .await?
        .ok_or_else(|| ImageError::Vanished(image.to_owned()))
}

/// What a fetch is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Pulling,
    Building,
}

#[derive(Debug)]
enum Fetch {
    /// Under way; these sandboxes wait for it.
    Running {
        stage: Stage,
        waiters: BTreeSet<SandboxId>,
    },
    /// It failed; these sandboxes waited for it and have not been told.
    Failed {
        error: String,
        untold: BTreeSet<SandboxId>,
    },
}

/// Whether a sandbox may provision with an image now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Availability {
    /// Present (or its presence could not be read: provisioning says why).
    Go,
    /// Being pulled or built in the background: what to tell.
    Fetching(String),
    /// The fetch this sandbox waited for failed: why.
    Failed(String),
}

/// What the background fetches need from the controller.
struct Tools {
    runtime: Arc<dyn Runtime>,
    metrics: Arc<Metrics>,
    build_command: Option<String>,
    build_timeout: Duration,
}

/// The background fetches of absent images, at most one per image, and the
/// sandboxes waiting for each (memory only: after a restart a reconcile
/// finds the image absent and starts a fetch again).
pub(crate) struct Fetches {
    fetches: Mutex<HashMap<String, Fetch>>,
    queue: WorkQueue<SandboxId>,
    tools: Tools,
}

impl Fetches {
    /// Fetches through `runtime` (whose pull is bounded by `--pull-timeout`),
    /// building with `config`'s command; waiting sandboxes go back on `queue`.
    pub(crate) fn new(
        runtime: Arc<dyn Runtime>,
        config: &ControllerConfig,
        metrics: Arc<Metrics>,
        queue: WorkQueue<SandboxId>,
    ) -> Arc<Self> {
        Arc::new(Self {
            fetches: Mutex::new(HashMap::new()),
            queue,
            tools: Tools {
                runtime,
                metrics,
                build_command: config.image_build_command.clone(),
                build_timeout: config.build_timeout,
            },
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Fetch>> {
        self.fetches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether sandbox `id` may provision with `image` now: if the image is
    /// absent, its fetch is started (or joined) and `id` is enqueued again
    /// when it ends; a fetch it waited for that failed is told once.
    pub(crate) async fn need(self: &Arc<Self>, image: &str, id: &SandboxId) -> Availability {
        if let Some(told) = self.join(image, id) {
            return told;
        }
        match self.tools.runtime.image_labels(image).await {
            Ok(None) => {}
            // Present, or unreadable: provisioning reads it again and says why.
            Ok(Some(_)) | Err(_) => return Availability::Go,
        }
        if let Err(own) = own_image::may_pull(image) {
            if self.tools.build_command.is_none() {
                // Never pulled, and nothing to build it with: say how.
                return Availability::Failed(own.to_string());
            }
        }
        let mut fetches = self.lock();
        if let Some(Fetch::Running { stage, waiters }) = fetches.get_mut(image) {
            waiters.insert(id.clone());
            return Availability::Fetching(waiting(image, *stage));
        }
        let stage = first_stage(image);
        fetches.insert(
            image.to_owned(),
            Fetch::Running {
                stage,
                waiters: BTreeSet::from([id.clone()]),
            },
        );
        self.tools.metrics.images.fetches(running(&fetches));
        drop(fetches);
        tracing::info!(image, sandbox = %id, "image absent; fetching it in the background");
        let this = self.clone();
        let name = image.to_owned();
        // The fetch runs in a task of its own, so that a panic in it still
        // ends the fetch and wakes the waiters.
        tokio::spawn(async move {
            let task = tokio::spawn(fetch(this.clone(), name.clone()));
            let result = task
                .await
                .unwrap_or_else(|_| Err(ImageError::Lost(name.clone())));
            this.finish(&name, result);
        });
        Availability::Fetching(waiting(image, stage))
    }

    /// Joins a running fetch of `image`, or tells `id` that the one it
    /// waited for failed; `None` when neither.
    fn join(&self, image: &str, id: &SandboxId) -> Option<Availability> {
        let mut fetches = self.lock();
        match fetches.get_mut(image)? {
            Fetch::Running { stage, waiters } => {
                waiters.insert(id.clone());
                Some(Availability::Fetching(waiting(image, *stage)))
            }
            Fetch::Failed { error, untold } => {
                if !untold.remove(id) {
                    return None;
                }
                let error = error.clone();
                if untold.is_empty() {
                    fetches.remove(image);
                }
                Some(Availability::Failed(error))
            }
        }
    }

    /// The fetch of `image` moved on to `stage`: its waiters look again, so
    /// that their status says so.
    fn moved_on(&self, image: &str, to: Stage) {
        let mut fetches = self.lock();
        if let Some(Fetch::Running { stage, waiters }) = fetches.get_mut(image) {
            *stage = to;
            for id in waiters.iter() {
                self.queue.add(id.clone());
            }
        }
    }

    /// The fetch of `image` ended: on success it is forgotten (the image is
    /// there), on failure its waiters are told once; either way they are
    /// enqueued again.
    fn finish(&self, image: &str, result: Result<(), ImageError>) {
        let mut fetches = self.lock();
        let waiters = match fetches.remove(image) {
            Some(Fetch::Running { waiters, .. }) => waiters,
            _ => BTreeSet::new(),
        };
        match result {
            Ok(()) => {
                tracing::info!(image, waiting = waiters.len(), "image fetched");
            }
            Err(e) => {
                tracing::warn!(image, waiting = waiters.len(), error = %e, "fetching the image failed");
                if !waiters.is_empty() {
                    fetches.insert(
                        image.to_owned(),
                        Fetch::Failed {
                            error: e.to_string(),
                            untold: waiters.clone(),
                        },
                    );
                }
            }
        }
        self.tools.metrics.images.fetches(running(&fetches));
        drop(fetches);
        for id in waiters {
            self.queue.add(id);
        }
    }
}

/// How many fetches are under way.
fn running(fetches: &HashMap<String, Fetch>) -> usize {
    fetches
        .values()
        .filter(|f| matches!(f, Fetch::Running { .. }))
        .count()
}

/// How the fetch of `image` begins: sandboxd's own images are never
/// pulled, only built.
fn first_stage(image: &str) -> Stage {
    if own_image::may_pull(image).is_ok() {
        Stage::Pulling
    } else {
        Stage::Building
    }
}

/// What a sandbox waiting for `image` is told.
fn waiting(image: &str, stage: Stage) -> String {
    match stage {
        Stage::Pulling => format!(
            "waiting for image {image}: it is being pulled (sandboxd carries on once the pull ends)"
        ),
        Stage::Building => format!(
            "waiting for image {image}: it is absent and being built by --image-build-command (sandboxd carries on once the build ends)"
        ),
    }
}

/// Pulls `image` (unless it is sandboxd's own: never pulled), else builds
/// it with the build command and checks that it then exists.
async fn fetch(fetches: Arc<Fetches>, image: String) -> Result<(), ImageError> {
    let tools = &fetches.tools;
    let absent: ImageError = match own_image::may_pull(&image) {
        Ok(()) => match tools.runtime.pull(&image).await {
            Ok(()) => {
                tools.metrics.images.pulled(true);
                return Ok(());
            }
            Err(e) => {
                tools.metrics.images.pulled(false);
                e.into()
            }
        },
        Err(own) => own.into(),
    };
    let Some(command) = &tools.build_command else {
        return Err(absent);
    };
    tracing::info!(
        image,
        command = command.as_str(),
        reason = %absent,
        "image absent; building it"
    );
    fetches.moved_on(&image, Stage::Building);
    let built = build(command, &image, tools.build_timeout).await;
    let present = tools.runtime.image_labels(&image).await.ok().flatten();
    let outcome = match (built, present) {
        (Ok(()), Some(_)) => Ok(()),
        (Ok(()), None) => Err(format!(
            "{command:?} succeeded but did not produce the image"
        )),
        (Err(reason), _) => Err(reason),
    };
    tools.metrics.images.built(outcome.is_ok());
    outcome.map_err(|reason| ImageError::Build { image, reason })
}

/// Runs the build command (`sh -c COMMAND sh IMAGE`, with `SANDBOXD_IMAGE`
/// set too) within `timeout`; its output goes to sandboxd's stderr.
async fn build(command: &str, image: &str, timeout: Duration) -> Result<(), String> {
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

/// The image label listing the features (allowlist names, comma-separated)
/// an image ships; sandboxd's own images carry it.
pub const FEATURES_LABEL: &str = "io.sandboxd.features";

/// The requested features an image's labels say it lacks; empty when it
/// has them all or does not say what it ships (then the engine's own
/// check after start decides).
pub fn missing_features(
    labels: &HashMap<String, String>,
    wanted: &BTreeSet<String>,
) -> Vec<String> {
    let Some(ships) = labels.get(FEATURES_LABEL) else {
        return Vec::new();
    };
    let ships: BTreeSet<&str> = ships.split(',').map(str::trim).collect();
    wanted
        .iter()
        .filter(|f| !ships.contains(f.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_image_that_lists_its_features_is_checked_against_the_request() {
        let labels = HashMap::from([(FEATURES_LABEL.to_owned(), "citext,pg_trgm".to_owned())]);
        assert_eq!(
            missing_features(&labels, &set(&["pg_trgm", "vector"])),
            ["vector"]
        );
        assert!(missing_features(&labels, &set(&["citext"])).is_empty());
    }

    #[test]
    fn an_image_that_does_not_list_its_features_is_not_refused() {
        assert!(missing_features(&HashMap::new(), &set(&["vector"])).is_empty());
    }
}
