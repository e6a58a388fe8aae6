//! Capped volumes on the Docker engine (see [`crate::domain::volume_disk`]):
//! a short privileged job makes each volume's ext4 file on the Docker host
//! and attaches it to a loop device; the Docker volume mounts that device.
//!
//! The job runs in a container, not in sandboxd's own process, so that it
//! works wherever sandboxd talks to the engine (on the host as root, or
//! in the compose stack's unprivileged container): it has CAP_SYS_ADMIN and
//! the loop devices (it needs them and `/dev`), has no network, and gets only the disks
//! directory, the host's `/dev` (a loop device made after the container
//! started appears there only) and three words: the operation, the volume
//! name (a sandboxd container name: letters, digits, `.`, `-`, `_`) and the
//! size.

use super::{api, is_status, DockerRuntime};
use crate::domain::volume_disk::{self, Verdict};
use crate::metrics::{self, DockerCall};
use crate::ports::runtime::{Disk, DiskStore, Runtime, RuntimeError, Volume};
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveVolumeOptions,
};
use std::collections::HashMap;
use std::time::Duration;

/// The job, run by `sh -c` with the operation, the volume and the size in
/// bytes as `$1`..`$3`:
///
/// - `attach`: makes `/disks/NAME.img` if missing (a sparse file, ext4
///   without reserved blocks, and without `lost+found`, so that Docker
///   copies the image's data directory into the empty root as it does
///   for any new volume), attaches it to a loop device unless it is
///   attached already, and prints `device=/dev/loopN`;
/// - `release`: detaches it from every loop device and removes it.
const JOB: &str = r#"set -eu
op=$1 name=$2 size=$3
f="/disks/$name.img"
attached() { losetup -j "$f" | cut -d: -f1; }
case $op in
attach)
	if [ ! -e "$f" ]; then
		rm -f "$f.new"
		truncate -s "$size" "$f.new"
		mkfs.ext4 -q -F -m 0 -L sandboxd "$f.new"
		debugfs -w -R 'rmdir lost+found' "$f.new" 2>/dev/null
		mv "$f.new" "$f"
	fi
	dev=$(attached | head -n 1)
	[ -n "$dev" ] || dev=$(losetup --find --show "$f")
	echo "device=$dev"
	;;
release)
	for dev in $(attached); do losetup -d "$dev"; done
	rm -f "$f" "$f.new"
	;;
*)
	echo "unknown operation $op" >&2
	exit 64
	;;
esac
"#;

/// The label of a disk job's container: the volume it works on.
const JOB_LABEL: &str = "io.sandboxd.disk-job";

impl DockerRuntime {
    /// Makes the capped volume `volume` ready to mount: its file made and
    /// attached, and a Docker volume that mounts that device (made again
    /// when it names another: see [`volume_disk::judge`]). `existing` is
    /// the driver options of the Docker volume under its name, if any (its
    /// labels were checked already).
    pub(super) async fn ensure_disk_volume(
        &self,
        volume: &Volume,
        disk: &Disk,
        existing: Option<HashMap<String, String>>,
    ) -> Result<(), RuntimeError> {
        if existing.as_ref().is_some_and(HashMap::is_empty) {
            tracing::warn!(
                volume = %volume.name,
                "a data volume from before --persistent-size: used uncapped (a new incarnation gets a capped one)"
            );
            return Ok(());
        }
        let output = self
            .disk_job("attach", &volume.name, &disk.store, disk.bytes)
            .await?;
        let device =
            volume_disk::reported_device(&output).ok_or_else(|| RuntimeError::DiskJob {
                op: "attach",
                volume: volume.name.clone(),
                code: 0,
                logs: format!("no device=/dev/loopN line in its output: {output}"),
            })?;
        match existing.map(|options| volume_disk::judge(&options, device)) {
            Some(Verdict::Use | Verdict::Uncapped) => return Ok(()),
            Some(Verdict::Remake) => {
                tracing::info!(volume = %volume.name, device, "the volume's file is on another loop device now (after a reboot?): making the Docker volume again");
                let _timer = metrics::time_docker_call(DockerCall::Volume);
                match self
                    .docker
                    .remove_volume(&volume.name, None::<RemoveVolumeOptions>)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if is_status(&e, &[404]) => {}
                    Err(e) => return Err(api("remove volume", &volume.name)(e)),
                }
            }
            None => {}
        }
        self.create_volume(volume, Some(volume_disk::driver_options(device)))
            .await
    }

    /// Before the capped volume `name` (driver options `options`) is
    /// removed: refuses while a container uses it, then detaches and
    /// removes its file in `disks`. Nothing for an uncapped volume.
    pub(super) async fn release_disk(
        &self,
        name: &str,
        options: &HashMap<String, String>,
        disks: &DiskStore,
    ) -> Result<(), RuntimeError> {
        if options.get("type").map(String::as_str) != Some(volume_disk::FS_TYPE) {
            return Ok(());
        }
        // Docker refuses to remove a volume in use; its file must not go
        // first either.
        let users = {
            let _timer = metrics::time_docker_call(DockerCall::List);
            let filters = HashMap::from([("volume", vec![name.to_owned()])]);
            let options = ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build();
            self.docker
                .list_containers(Some(options))
                .await
                .map_err(api("list containers of volume", name))?
        };
        if !users.is_empty() {
            return Err(RuntimeError::Refused(format!(
                "volume {name} is in use by {} container(s); it is removed once they are gone",
                users.len()
            )));
        }
        self.disk_job("release", name, disks, 0).await.map(drop)
    }

    /// Runs the disk job `op` for `volume` and returns its output.
    async fn disk_job(
        &self,
        op: &'static str,
        volume: &str,
        store: &DiskStore,
        bytes: u64,
    ) -> Result<String, RuntimeError> {
        let name = format!("{volume}.disk");
        // One a crash left behind.
        self.remove_any(&name, Duration::ZERO).await?;
        let body = ContainerCreateBody {
            image: Some(store.image.clone()),
            user: Some("0:0".into()),
            entrypoint: Some(vec!["sh".into(), "-c".into(), JOB.into(), "disk".into()]),
            cmd: Some(vec![op.into(), volume.into(), bytes.to_string()]),
            labels: Some(HashMap::from([(JOB_LABEL.to_owned(), volume.to_owned())])),
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                // Not --privileged (it asks for every capability, which a
                // daemon without some of them cannot grant): loop devices
                // (block 7:*, loop-control 10:237) and what losetup needs.
                cap_drop: Some(vec!["ALL".into()]),
                cap_add: Some(vec!["SYS_ADMIN".into()]),
                device_cgroup_rules: Some(vec!["b 7:* rwm".into(), "c 10:237 rwm".into()]),
                binds: Some(vec![format!("{}:/disks", store.dir), "/dev:/dev".into()]),
                network_mode: Some("none".into()),
                readonly_rootfs: Some(true),
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: Some(HashMap::from([("max-size".to_owned(), "1m".to_owned())])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        {
            let _timer = metrics::time_docker_call(DockerCall::Create);
            let options = CreateContainerOptionsBuilder::default().name(&name).build();
            self.docker
                .create_container(Some(options), body)
                .await
                .map_err(api("create", &name))?;
        }
        let ran = async {
            self.docker
                .start_container(&name, None)
                .await
                .map_err(api("start", &name))?;
            self.wait_exit(&name).await
        }
        .await;
        let logs = self
            .logs_tail(&crate::domain::id::ContainerId::new(name.clone()), 20)
            .await
            .unwrap_or_else(|e| format!("(logs unavailable: {e})"));
        if let Err(e) = self.remove_any(&name, Duration::ZERO).await {
            tracing::warn!(container = %name, error = %e, "could not remove a disk job's container");
        }
        match ran? {
            0 => {
                tracing::debug!(volume, op, "disk job done");
                Ok(logs)
            }
            code => Err(RuntimeError::DiskJob {
                op,
                volume: volume.to_owned(),
                code,
                logs,
            }),
        }
    }
}
