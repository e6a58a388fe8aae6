//! Making sure an engine image is present: used if it is, else pulled, else
//! (when `--image-build-command` is set) built by that command and used if
//! it then exists. Pulls and builds are counted.

use crate::config::ControllerConfig;
use crate::metrics::Metrics;
use crate::ports::runtime::{Runtime, RuntimeError};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// Why an image could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image is absent and the pull failed (no build command is set).
    #[error(transparent)]
    Unavailable(#[from] RuntimeError),
    /// The image could not be pulled and the build command failed.
    #[error("image {image} could not be pulled, and building it failed: {reason}; check --image-build-command")]
    Build {
        /// The image reference.
        image: String,
        /// What went wrong.
        reason: String,
    },
}

/// Makes sure `image` is present and returns its labels.
pub(crate) async fn ensure(
    runtime: &dyn Runtime,
    config: &ControllerConfig,
    metrics: &Metrics,
    image: &str,
) -> Result<HashMap<String, String>, ImageError> {
    if let Some(labels) = runtime.image_labels(image).await? {
        return Ok(labels);
    }
    let pull_error = match runtime.pull(image).await {
        Ok(()) => {
            metrics.image_pulled(true);
            return Ok(runtime.image_labels(image).await?.unwrap_or_default());
        }
        Err(e) => {
            metrics.image_pulled(false);
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
    let built = build(command, image, config.build_timeout).await;
    let present = runtime.image_labels(image).await.ok().flatten();
    let outcome = match (built, present) {
        (Ok(()), Some(labels)) => Ok(labels),
        (Ok(()), None) => Err(format!(
            "{command:?} succeeded but did not produce the image"
        )),
        (Err(reason), _) => Err(reason),
    };
    metrics.image_built(outcome.is_ok());
    outcome.map_err(|reason| ImageError::Build {
        image: image.to_owned(),
        reason,
    })
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
