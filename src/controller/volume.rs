//! Persistent sandboxes' data: one named volume per engine, created with
//! the container that mounts it and removed only once the row is deleted
//! and no container of the sandbox is left. A volume is labelled with its
//! state database's identity and its row's incarnation: another
//! database's is never removed, and an earlier incarnation's is never
//! mounted (it is removed once that incarnation's containers are gone).
//! Each is capped at `--persistent-size` by the file system it lives on
//! (see `domain::volume_disk`), whose file goes with it.

use super::Context;
use crate::config::ControllerConfig;
use crate::domain::fork;
use crate::domain::id::SandboxId;
use crate::domain::identity::{self, StateId};
use crate::domain::labels::ContainerLabels;
use crate::domain::network::container_name;
use crate::domain::sandbox::DesiredSandbox;
use crate::engine::Engine;
use crate::ports::runtime::{ObservedResource, RuntimeError, Volume};

/// The named volume holding `engine`'s data for the persistent sandbox
/// whose container carries `labels`: named like its container, labelled
/// like its network plus the container's state database and incarnation.
pub fn data_volume(
    config: &ControllerConfig,
    labels: &ContainerLabels,
    engine: &'static dyn Engine,
) -> Volume {
    Volume {
        name: data_volume_name(config, &labels.sandbox, engine),
        path: engine.data_path().to_owned(),
        labels: labels.of_volume(),
        disk: config.persistent_disk(),
    }
}

/// The name of `engine`'s data volume for sandbox `id`.
fn data_volume_name(
    config: &ControllerConfig,
    id: &SandboxId,
    engine: &'static dyn Engine,
) -> String {
    container_name(&config.deployment, id, engine.name())
}

/// The data volumes of sandbox `id` that this state database (`state`)
/// may remove: those of every engine this controller knows (a persistent
/// sandbox's data, a fork's copy of its source's) that carry its
/// identity, or none (created before identities).
async fn removable(
    ctx: &Context,
    id: &SandboxId,
    state: &StateId,
) -> Result<Vec<ObservedResource>, RuntimeError> {
    let names: Vec<String> = ctx
        .engines
        .iter()
        .flat_map(|engine| {
            [
                data_volume_name(&ctx.config, id, engine),
                fork::volume_name(&ctx.config.deployment, id, engine.name()),
            ]
        })
        .collect();
    Ok(ctx
        .runtime
        .volumes(&ctx.config.deployment)
        .await?
        .into_iter()
        .filter(|v| names.contains(&v.name))
        .filter(|v| {
            let ours = identity::resource_is_ours(v.state_id.as_deref(), state);
            if !ours {
                tracing::debug!(volume = %v.name, "another state database's volume: left alone");
            }
            ours
        })
        .collect())
}

/// Removes the data volumes of the deleted sandbox `id` (a missing one is
/// success; another state database's is left alone).
pub(crate) async fn remove_all(
    ctx: &Context,
    id: &SandboxId,
    state: &StateId,
) -> Result<(), RuntimeError> {
    for volume in removable(ctx, id, state).await? {
        ctx.runtime
            .remove_volume(
                &volume.name,
                &ctx.config.deployment,
                Some(&ctx.config.disks),
            )
            .await?;
    }
    Ok(())
}

/// Removes the data volumes (and fork copies) an earlier incarnation of
/// `desired`'s id left (its containers must be gone: a volume in use is
/// not removed), so the row's own containers never start on them. Volumes from before
/// incarnations are the row's.
pub(crate) async fn remove_superseded(
    ctx: &Context,
    desired: &DesiredSandbox,
    state: &StateId,
) -> Result<(), RuntimeError> {
    let Some(row) = &desired.incarnation else {
        return Ok(());
    };
    for volume in removable(ctx, &desired.id, state).await? {
        if volume
            .incarnation
            .as_deref()
            .is_some_and(|theirs| theirs != row.as_str())
        {
            ctx.runtime
                .remove_volume(
                    &volume.name,
                    &ctx.config.deployment,
                    Some(&ctx.config.disks),
                )
                .await?;
            tracing::info!(volume = %volume.name, "an earlier incarnation's data volume removed");
        }
    }
    Ok(())
}

/// What this deployment's capped volumes take of the Docker host's disk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct DiskUse {
    /// Bytes their files occupy (allocated blocks: what a full one costs
    /// the host, at most its size).
    used: u64,
    /// Their caps, summed.
    size: u64,
}

/// Publishes `sandboxd_persistent_disk_bytes` from the files of the
/// listed volumes in `--persistent-disks-dir`, when sandboxd sees that
/// directory (on the Docker host, or mounted into its container); a
/// `stat` per volume, at each relist.
pub(crate) async fn publish_use(ctx: &Context, volumes: &[ObservedResource]) {
    let dir = std::path::PathBuf::from(&ctx.config.disks.dir);
    let names: Vec<String> = volumes.iter().map(|v| v.name.clone()).collect();
    if names.is_empty() {
        // Nothing to measure: no thread (a thread's timing would also make
        // a simulated world's order depend on the host's scheduler).
        ctx.metrics.fleet.persistent_disks(0, 0);
        return;
    }
    match tokio::task::spawn_blocking(move || measure(&dir, &names)).await {
        Ok(Some(usage)) => ctx.metrics.fleet.persistent_disks(usage.used, usage.size),
        Ok(None) => {
            tracing::debug!(dir = %ctx.config.disks.dir, "the disks directory is not visible here: no volume use measured");
        }
        Err(e) => tracing::warn!(error = %e, "measuring the volumes' use failed"),
    }
}

/// The use of the files `DIR/NAME.img` of `names`; `None` when `dir` is
/// not visible.
fn measure(dir: &std::path::Path, names: &[String]) -> Option<DiskUse> {
    use std::os::unix::fs::MetadataExt;
    if !dir.is_dir() {
        return None;
    }
    let mut usage = DiskUse::default();
    for name in names {
        if let Ok(file) = std::fs::metadata(dir.join(format!("{name}.img"))) {
            usage.used += file.blocks() * 512;
            usage.size += file.len();
        }
    }
    Some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_counts_the_listed_volumes_files_only() {
        let dir = std::env::temp_dir().join(format!("sandboxd-disk-use-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.img"), vec![1u8; 8192]).unwrap();
        let sparse = std::fs::File::create(dir.join("b.img")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        std::fs::write(dir.join("other.img"), vec![1u8; 8192]).unwrap();
        let usage = measure(&dir, &["a".into(), "b".into(), "gone".into()]).unwrap();
        assert_eq!(usage.size, 8192 + (1 << 20));
        assert!(
            usage.used >= 8192 && usage.used < 8192 + (1 << 20),
            "{usage:?}"
        );
        assert_eq!(measure(&dir.join("missing"), &["a".into()]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
