//! Named volumes (a persistent sandbox's data, a template, a fork's copy, a
//! seed's data file) and the short-lived containers that fill them: the
//! template job, the fork's helper, the file writer.

use super::{ObservedResource, RuntimeError, Tmpfs};
use crate::domain::container::ByteStream;
use crate::domain::id::{ContainerId, Deployment};
use crate::domain::limits::Limits;
use async_trait::async_trait;
use std::collections::HashMap;
use std::time::Duration;

/// A named volume mounted in a container: created with `labels` if it
/// does not exist, refused if it exists with another deployment's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Volume name.
    pub name: String,
    /// Mount point (the runtime copies the image's directory there into a
    /// new volume, ownership included).
    pub path: String,
    /// Labels (deployment and sandbox, so that it is found and cleaned up).
    pub labels: HashMap<String, String>,
    /// Its size cap, enforced by the file system (persistent sandboxes'
    /// data; `None`: uncapped, as templates are, whose content is fixed).
    pub disk: Option<Disk>,
}

/// Where capped volumes keep their file systems: one sparse file
/// `DIR/NAME.KEY.img` per volume on the Docker host, made, attached to a loop
/// device and removed by a short privileged job in `image`
/// (see `domain::volume_disk`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskStore {
    /// The directory of the files, on the Docker host.
    pub dir: String,
    /// The image of the job (`deploy/images/disk`: e2fsprogs, util-linux).
    pub image: String,
}

/// A volume's size cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// Where its file lives.
    pub store: DiskStore,
    /// Its size in bytes (a file made earlier keeps the size it was made with).
    pub bytes: u64,
}

/// A one-off container that fills a template volume and exits: no
/// network, no published port, no standard input, the same hardening as a
/// sandbox container (read-only root, no capabilities, caps, tmpfs), and
/// the volume read-write at its mount point. Running the job on a volume
/// that holds a complete template must succeed without changing it, so a
/// template is built once however often the job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateJob {
    /// Container name.
    pub name: String,
    /// The engine image.
    pub image: String,
    /// Environment (never a credential: a template holds none).
    pub env: Vec<String>,
    /// Arguments to the image's entrypoint.
    pub cmd: Vec<String>,
    /// Container labels (so a crashed job's container is found and removed).
    pub labels: HashMap<String, String>,
    /// `uid:gid` the container runs as.
    pub user: String,
    /// Resource caps.
    pub limits: Limits,
    /// tmpfs mounts (`/tmp`, runtime directories).
    pub tmpfs: Vec<Tmpfs>,
    /// The template volume, created with its labels if missing.
    pub volume: Volume,
    /// A volume for the image's binaries, created with its labels if
    /// missing and mounted read-write, so that Docker fills it from the
    /// image when it is empty. Containers that mount it read-only share
    /// one page cache of the binaries instead of each reading its own copy
    /// through the storage driver (which each container pays for in
    /// memory on fuse-overlayfs).
    pub binaries: Option<Volume>,
}

/// A short-lived container in another container's PID and network
/// namespaces (it sees its processes, through `/proc/1/root` its files,
/// and its loopback), holding a volume read-write: a fork's copy is taken
/// in one, with `docker exec`. No network of its own, no published port,
/// no standard input, the same hardening as a sandbox container; it exits
/// on its own after
/// [`Helper::lifetime`] and is then removed by the runtime, so a helper
/// that sandboxd lost track of does not stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    /// Container name.
    pub name: String,
    /// The image (its tools: the source's image).
    pub image: String,
    /// Container labels.
    pub labels: HashMap<String, String>,
    /// `uid:gid` the container runs as (the source's: files and
    /// `/proc/1/root` are reachable for the same user only).
    pub user: String,
    /// Resource caps.
    pub limits: Limits,
    /// tmpfs mounts (`/tmp`, runtime directories).
    pub tmpfs: Vec<Tmpfs>,
    /// Created with its labels if missing (refused if another sandbox's),
    /// mounted read-write.
    pub volume: Volume,
    /// The container whose PID and network namespaces it joins.
    pub sees: ContainerId,
    /// How long it lives at most.
    pub lifetime: Duration,
}

/// One file written into a volume by a container that is created, given
/// the file through Docker's archive upload, and removed, never started:
/// how a seed's data file (a Redis RDB file) gets into the volume its
/// containers start from. Writing it again writes the same file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFill {
    /// The container's name.
    pub name: String,
    /// Its image (the engine's: the volume takes the mount point's owner).
    pub image: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
    /// The volume: created with its labels if missing; one that exists
    /// must carry them.
    pub volume: Volume,
    /// The file's name in the volume.
    pub file: String,
    /// The file's owner, `uid:gid`.
    pub owner: String,
}

/// A file's content for [`Volumes::fill_volume`], as it streams in.
pub struct FileContent {
    /// Its length in bytes, which the chunks must add up to.
    pub len: u64,
    /// The content.
    pub chunks: ByteStream<'static>,
}

/// The runtime's volumes, and the containers that fill them.
#[async_trait]
pub trait Volumes: Send + Sync {
    /// The volumes `deployment` created.
    async fn volumes(&self, deployment: &Deployment)
        -> Result<Vec<ObservedResource>, RuntimeError>;
    /// Removes the volume `name` if it exists and its labels say
    /// `deployment` created it, and its capped file system's file in
    /// `disks` if it has one. Idempotent; fails while a container uses it.
    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError>;
    /// Runs `job` to its end (creating its volume if missing) and removes
    /// its container; fails with the exit code and the last lines of its
    /// output unless it exits 0.
    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError>;
    /// Starts a [`Helper`] and returns its id; [`Commands::exec`](super::Commands::exec) runs in
    /// it, [`Containers::remove`](super::Containers::remove) ends it. A runtime that cannot place a
    /// container next to another's processes refuses.
    async fn start_helper(&self, helper: &Helper) -> Result<ContainerId, RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "helper {}: this runtime cannot start a container in another's PID namespace (forks need --backend docker)",
            helper.name
        )))
    }
    /// Writes [`VolumeFill::file`] into its volume with `content`, which
    /// streams in (an `Err` in it fails the write). A runtime that cannot
    /// reach a volume from here refuses.
    async fn fill_volume(
        &self,
        fill: &VolumeFill,
        _content: FileContent,
    ) -> Result<(), RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "volume {}: this runtime cannot write a file into a volume (data-file seeds need --backend docker)",
            fill.volume.name
        )))
    }
}
