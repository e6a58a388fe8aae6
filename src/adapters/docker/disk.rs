//! Capped volumes on the Docker engine (see [`crate::domain::volume_disk`]):
//! a short privileged job makes each volume's ext4 file on the Docker host
//! and attaches it to a loop device; the Docker volume mounts that device.
//!
//! The job runs in a container, not in sandboxd's own process, so that it
//! works wherever sandboxd talks to the engine (on the host as root, or
//! in the compose stack's unprivileged container): it has CAP_SYS_ADMIN and
//! the loop devices (it needs them and `/dev`), has no network, and gets only the disks
//! directory, the host's `/dev` (a loop device made after the container
//! started appears there only) and five words: the operation, the volume
//! name (a sandboxd container name: letters, digits, `.`, `-`, `_`), the
//! size, the file's key (hex digits) and whether the Docker volume is new.

use super::{api, is_status, DockerRuntime};
use crate::domain::hex::encode as domain_hex;
use crate::domain::volume_disk::{self, Verdict};
use crate::metrics::{self, DockerCall};
use crate::ports::runtime::{Containers, Disk, DiskStore, RuntimeError, Volume};
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveVolumeOptions,
};
use std::collections::HashMap;
use std::time::Duration;

/// A Docker volume that exists under a capped volume's name.
pub(super) struct Existing {
    /// Its driver options (empty: a plain volume from before caps).
    pub(super) options: HashMap<String, String>,
    /// Its labels (the file's key among them, unless it predates keys).
    pub(super) labels: HashMap<String, String>,
}

/// The job, run by `sh -c` with the operation, the volume, the size in
/// bytes, the file's key (empty: a volume from before keys) and whether
/// the Docker volume is new (`1`) as `$1`..`$5`:
///
/// - `attach`: for a new Docker volume first removes every file of the
///   name (no volume names them: orphans of a volume lost behind
///   sandboxd's back; each printed as `removed=FILE`); makes
///   `/disks/NAME.KEY.img` if missing (a sparse file, ext4 without
///   reserved blocks, and without `lost+found`, so that Docker copies the
///   image's data directory into the empty root as it does for any new
///   volume), attaches it to a loop device unless it is attached already,
///   and prints `device=/dev/loopN`;
/// - `release`: detaches every file of the name from its loop devices and
///   removes it.
///
/// The files of a name are `NAME.img` and `NAME.<32 hex digits>.img`
/// (and their `.new` while being made): the rule of
/// `volume_disk::volume_of`, so `NAME.fork…` is never one.
const JOB: &str = r#"set -eu
op=$1 name=$2 size=$3 key=$4 fresh=$5
if [ -n "$key" ]; then f="/disks/$name.$key.img"; else f="/disks/$name.img"; fi
attached() { losetup -j "$1" | cut -d: -f1; }
drop() {
	for dev in $(attached "$1"); do losetup -d "$dev"; done
	rm -f "$1"
}
files() {
	for g in "/disks/$name".*; do
		[ -e "$g" ] || continue
		k=${g#"/disks/$name."}
		k=${k%.new}
		case $k in
		img) echo "$g" ;;
		*.img)
			k=${k%.img}
			case $k in
			*[!0-9a-f]*) ;;
			*) if [ ${#k} -eq 32 ]; then echo "$g"; fi ;;
			esac
			;;
		esac
	done
}
case $op in
attach)
	if [ "$fresh" = 1 ]; then
		for g in $(files); do
			if [ "$g" != "$f" ]; then
				drop "$g"
				echo "removed=$g"
			fi
		done
	fi
	if [ ! -e "$f" ]; then
		rm -f "$f.new"
		truncate -s "$size" "$f.new"
		mkfs.ext4 -q -F -m 0 -L sandboxd "$f.new"
		debugfs -w -R 'rmdir lost+found' "$f.new" 2>/dev/null
		mv "$f.new" "$f"
	fi
	dev=$(attached "$f" | head -n 1)
	[ -n "$dev" ] || dev=$(losetup --find --show "$f")
	echo "device=$dev"
	;;
release)
	for g in $(files); do drop "$g"; done
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
    /// the Docker volume under its name, if any (its labels were checked
    /// already). A new Docker volume gets a new key, so a new file: a file
    /// left by a volume lost behind sandboxd's back is never mounted again
    /// (the job removes it).
    pub(super) async fn ensure_disk_volume(
        &self,
        volume: &Volume,
        disk: &Disk,
        existing: Option<Existing>,
    ) -> Result<(), RuntimeError> {
        if existing.as_ref().is_some_and(|e| e.options.is_empty()) {
            tracing::warn!(
                volume = %volume.name,
                "a data volume from before --persistent-size: used uncapped (a new incarnation gets a capped one)"
            );
            return Ok(());
        }
        let key = match &existing {
            Some(e) => volume_disk::key_of(&e.labels).map(str::to_owned),
            None => Some(domain_hex(&rand::random::<[u8; 16]>())),
        };
        let output = self
            .disk_job(
                "attach",
                &volume.name,
                &disk.store,
                disk.bytes,
                key.as_deref(),
                existing.is_none(),
            )
            .await?;
        for orphan in output.lines().filter_map(|l| l.strip_prefix("removed=")) {
            tracing::warn!(volume = %volume.name, file = orphan, "removed the file of a capped volume that no Docker volume names any more (removed behind sandboxd's back): its data is never mounted again");
        }
        let device =
            volume_disk::reported_device(&output).ok_or_else(|| RuntimeError::DiskJob {
                op: "attach",
                volume: volume.name.clone(),
                code: 0,
                logs: format!("no device=/dev/loopN line in its output: {output}"),
            })?;
        match existing.map(|e| volume_disk::judge(&e.options, device)) {
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
        let mut keyed = volume.clone();
        if let Some(key) = key {
            keyed.labels.insert(volume_disk::KEY_LABEL.to_owned(), key);
        }
        self.create_volume(&keyed, Some(volume_disk::driver_options(device)))
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
        self.disk_job("release", name, disks, 0, None, false)
            .await
            .map(drop)
    }

    /// Runs the disk job `op` for `volume` (its file's `key`; `fresh`: the
    /// Docker volume is new) and returns its output.
    async fn disk_job(
        &self,
        op: &'static str,
        volume: &str,
        store: &DiskStore,
        bytes: u64,
        key: Option<&str>,
        fresh: bool,
    ) -> Result<String, RuntimeError> {
        let name = format!("{volume}.disk");
        // One a crash left behind.
        self.remove_any(&name, Duration::ZERO).await?;
        let body = ContainerCreateBody {
            image: Some(store.image.clone()),
            user: Some("0:0".into()),
            entrypoint: Some(vec!["sh".into(), "-c".into(), JOB.into(), "disk".into()]),
            cmd: Some(vec![
                op.into(),
                volume.into(),
                bytes.to_string(),
                key.unwrap_or_default().into(),
                if fresh { "1" } else { "0" }.into(),
            ]),
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
