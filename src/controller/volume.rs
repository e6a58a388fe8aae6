//! Persistent sandboxes' data: one named volume per engine, created with
//! the container that mounts it and removed only once the row is deleted
//! and no container of the sandbox is left.

use super::Context;
use crate::config::ControllerConfig;
use crate::domain::id::SandboxId;
use crate::domain::labels;
use crate::domain::network::container_name;
use crate::engine::Engine;
use crate::ports::runtime::{RuntimeError, Volume};

/// The named volume holding `engine`'s data for a persistent sandbox: named
/// like its container, labelled like its network.
pub fn data_volume(
    config: &ControllerConfig,
    id: &SandboxId,
    engine: &'static dyn Engine,
) -> Volume {
    Volume {
        name: container_name(&config.deployment, id, engine.name()),
        path: engine.data_path().to_owned(),
        labels: labels::of_sandbox(&config.deployment, id),
    }
}

/// Removes the data volumes of the deleted sandbox `id` (those of every
/// engine this controller knows; a missing one is success).
pub(crate) async fn remove_all(ctx: &Context, id: &SandboxId) -> Result<(), RuntimeError> {
    for engine in ctx.engines.iter() {
        let volume = data_volume(&ctx.config, id, engine);
        ctx.runtime
            .remove_volume(&volume.name, &ctx.config.deployment)
            .await?;
    }
    Ok(())
}
