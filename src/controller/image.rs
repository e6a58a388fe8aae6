//! Making sure an engine image is present: used if it is, else pulled, else
//! (when `--image-build-command` is set) built by that command and used if
//! it then exists. Pulls and builds are counted.

use crate::config::ControllerConfig;
use crate::metrics::Metrics;
use crate::ports::runtime::{Runtime, RuntimeError};
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

/// Makes sure `image` is present.
pub(crate) async fn ensure(
    runtime: &dyn Runtime,
    config: &ControllerConfig,
    metrics: &Metrics,
    image: &str,
) -> Result<(), ImageError> {
    if runtime.image_exists(image).await? {
        return Ok(());
    }
    let pull_error = match runtime.pull(image).await {
        Ok(()) => {
            metrics.image_pulled(true);
            return Ok(());
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
    let present = runtime.image_exists(image).await.unwrap_or(false);
    let outcome = match built {
        Ok(()) if present => Ok(()),
        Ok(()) => Err(format!(
            "{command:?} succeeded but did not produce the image"
        )),
        Err(reason) => Err(reason),
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
