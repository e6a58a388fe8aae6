//! Persistent sandboxes' data: one named volume per engine, created with
//! the container that mounts it and removed only once the row is deleted
//! and no container of the sandbox is left. A volume is labelled with its
//! state database's identity and its row's incarnation: another
//! database's is never removed, and an earlier incarnation's is never
//! mounted (it is removed once that incarnation's containers are gone).
//! Each is capped at `--persistent-size` by the file system it lives on
//! (see `domain::volume_disk`), whose file goes with it.

use super::env::Env;
use crate::config::ControllerConfig;
use crate::domain::fork;
use crate::domain::id::SandboxId;
use crate::domain::identity::{self, StateId};
use crate::domain::labels::ContainerLabels;
use crate::domain::network::container_name;
use crate::domain::sandbox::DesiredSandbox;
use crate::domain::volume_disk;
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
    env: &Env,
    id: &SandboxId,
    state: &StateId,
) -> Result<Vec<ObservedResource>, RuntimeError> {
    let names: Vec<String> = env
        .engines
        .iter()
        .flat_map(|engine| {
            [
                data_volume_name(&env.config, id, engine),
                fork::volume_name(&env.config.deployment, id, engine.name()),
            ]
        })
        .collect();
    Ok(env
        .runtime
        .volumes(&env.config.deployment)
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
    env: &Env,
    id: &SandboxId,
    state: &StateId,
) -> Result<(), RuntimeError> {
    for volume in removable(env, id, state).await? {
        env.runtime
            .remove_volume(
                &volume.name,
                &env.config.deployment,
                Some(&env.config.disks),
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
    env: &Env,
    desired: &DesiredSandbox,
    state: &StateId,
) -> Result<(), RuntimeError> {
    let Some(row) = &desired.incarnation else {
        return Ok(());
    };
    for volume in removable(env, &desired.id, state).await? {
        if volume
            .incarnation
            .as_deref()
            .is_some_and(|theirs| theirs != row.as_str())
        {
            env.runtime
                .remove_volume(
                    &volume.name,
                    &env.config.deployment,
                    Some(&env.config.disks),
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
    /// Bytes the files of this deployment's capped volumes occupy that no
    /// listed volume names: left by volumes removed behind sandboxd's
    /// back, until a volume of the same name is made again (the job then
    /// removes them) or the operator does.
    orphaned: u64,
}

/// How old a file no listed volume names must be to count as orphaned: a
/// file made while a relist ran is named by a volume it did not list yet.
const ORPHAN_AGE: std::time::Duration = std::time::Duration::from_secs(120);

/// Publishes `sandboxd_persistent_disk_bytes` from the files of the
/// listed volumes in `--persistent-disks-dir`, when sandboxd sees that
/// directory (on the Docker host, or mounted into its container); a
/// `stat` per volume and a listing of the directory, at each relist.
pub(crate) async fn publish_use(env: &Env, volumes: &[ObservedResource]) {
    let dir = std::path::PathBuf::from(&env.config.disks.dir);
    if !dir.is_dir() {
        // Nothing to measure, or nowhere to: no thread (a thread's timing
        // would also make a simulated world's order depend on the host's
        // scheduler, and its volumes are forks' and seeds').
        match volumes.is_empty() {
            true => env.metrics.fleet.persistent_disks(0, 0, 0),
            false => {
                tracing::debug!(dir = %env.config.disks.dir, "the disks directory is not visible here: no volume use measured")
            }
        }
        return;
    }
    let files: Vec<String> = volumes
        .iter()
        .map(|v| volume_disk::file_name(&v.name, v.disk_key.as_deref()))
        .collect();
    let prefix = format!("sandboxd.{}.", env.config.deployment);
    match tokio::task::spawn_blocking(move || measure(&dir, &files, &prefix)).await {
        Ok(Some(usage)) => {
            env.metrics
                .fleet
                .persistent_disks(usage.used, usage.size, usage.orphaned);
        }
        Ok(None) => {
            tracing::debug!(dir = %env.config.disks.dir, "the disks directory is not visible here: no volume use measured");
        }
        Err(e) => tracing::warn!(error = %e, "measuring the volumes' use failed"),
    }
}

/// The use of `files` in `dir`, and of the other files there of volumes
/// whose names start with `prefix` (this deployment's), older than
/// [`ORPHAN_AGE`]; `None` when `dir` is not visible.
fn measure(dir: &std::path::Path, files: &[String], prefix: &str) -> Option<DiskUse> {
    use std::os::unix::fs::MetadataExt;
    let entries = std::fs::read_dir(dir).ok()?;
    let mut usage = DiskUse::default();
    for file in files {
        if let Ok(meta) = std::fs::metadata(dir.join(file)) {
            usage.used += meta.blocks() * 512;
            usage.size += meta.len();
        }
    }
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let ours = volume_disk::volume_of(name).is_some_and(|v| v.starts_with(prefix));
        if !ours || files.iter().any(|f| f == name) {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= ORPHAN_AGE);
        if old {
            usage.orphaned += meta.blocks() * 512;
        }
    }
    Some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_counts_the_listed_volumes_files_and_old_unlisted_ones_of_the_deployment_as_orphaned() {
        let dir = std::env::temp_dir().join(format!("sandboxd-disk-use-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write =
            |name: &str, len: usize| std::fs::write(dir.join(name), vec![1u8; len]).unwrap();
        write("sandboxd.d.a.redis.img", 8192);
        let sparse = std::fs::File::create(dir.join("sandboxd.d.b.redis.img")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        // Unlisted: this deployment's (an orphan, once old enough), another
        // deployment's, something else.
        write("sandboxd.d.c.redis.img", 4096);
        write("sandboxd.e.a.redis.img", 8192);
        write("sandboxd.d.notes", 8192);
        let listed = [
            "sandboxd.d.a.redis.img".to_owned(),
            "sandboxd.d.b.redis.img".to_owned(),
            "sandboxd.d.gone.redis.img".to_owned(),
        ];
        let usage = measure(&dir, &listed, "sandboxd.d.").unwrap();
        assert_eq!(usage.size, 8192 + (1 << 20));
        assert!(
            usage.used >= 8192 && usage.used < 8192 + (1 << 20),
            "{usage:?}"
        );
        assert_eq!(
            usage.orphaned, 0,
            "a new file may be a volume's not listed yet"
        );
        let old = std::time::SystemTime::now() - ORPHAN_AGE;
        for name in [
            "sandboxd.d.c.redis.img",
            "sandboxd.e.a.redis.img",
            "sandboxd.d.notes",
        ] {
            std::fs::File::options()
                .write(true)
                .open(dir.join(name))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let usage = measure(&dir, &listed, "sandboxd.d.").unwrap();
        assert_eq!(usage.orphaned, 4096, "{usage:?}");
        assert_eq!(measure(&dir.join("missing"), &listed, "sandboxd.d."), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
