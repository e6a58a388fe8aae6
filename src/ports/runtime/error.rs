//! How a runtime call fails, whichever role it belongs to.

use crate::domain::id::ContainerId;
use crate::ports::BoxError;
use std::time::Duration;

/// Failures of the container runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The daemon could not be reached.
    #[error("cannot reach the Docker daemon ({0}); is dockerd running and is DOCKER_HOST or /var/run/docker.sock correct?")]
    Connect(#[source] BoxError),
    /// An image is absent and could not be pulled.
    #[error("image {image} is not present and could not be pulled ({reason}); build local images with deploy/images/build.sh and point --image/--features-image at them")]
    ImageUnavailable {
        /// The image reference.
        image: String,
        /// Why the pull failed.
        reason: String,
    },
    /// An API call failed.
    #[error("docker {op} failed for {target}: {source}")]
    Api {
        /// What sandboxd was doing.
        op: &'static str,
        /// Container, image or network name.
        target: String,
        /// The runtime's error.
        #[source]
        source: BoxError,
    },
    /// Docker works, but sandboxd will not do what was asked.
    #[error("{0}")]
    Refused(String),
    /// A container could not start because its network is gone (removed
    /// or pruned out of band).
    #[error("network {network} is gone (removed or pruned behind sandboxd's back); sandboxd creates it again")]
    NetworkGone {
        /// The network's name.
        network: String,
    },
    /// The container name is still held by a container Docker is removing
    /// (`docker rm -f` answers before the removal is done; a removal that
    /// failed half-way leaves the container `dead`): the name is free once
    /// that container is gone, so the create is worth trying again then
    /// (see `controller::network::create_and_start`).
    #[error("the container name {name} is still held by container {holder}, which Docker is removing; sandboxd waits for the removal, then creates it")]
    NameBeingRemoved {
        /// The container name.
        name: String,
        /// The container that holds it.
        holder: ContainerId,
    },
    /// A container Docker was removing still held the container name
    /// when the wait for its removal ran out.
    #[error("the container name {name} is still held by container {holder}, which Docker began removing more than {after:?} ago; is the daemon or its storage stuck? (`docker inspect {holder}`; `docker rm -f {holder}` ends it); sandboxd tries again at the next reconcile")]
    NameStillHeld {
        /// The container name.
        name: String,
        /// The container that holds it.
        holder: ContainerId,
        /// How long sandboxd waited.
        after: Duration,
    },
    /// A template job exited with an error.
    #[error("template job {name} exited with code {code}; last log lines:\n{logs}")]
    TemplateJob {
        /// The job's container name.
        name: String,
        /// Its exit code.
        code: i64,
        /// The tail of its output (a template holds no credential).
        logs: String,
    },
    /// The job that makes, attaches or removes a capped volume's file
    /// system failed (see [`crate::domain::volume_disk`]).
    #[error("the disk job ({op}) of volume {volume} exited with code {code}; check that its image exists (deploy/images/build.sh builds sandboxd/disk), that loop devices can be had on the Docker host (losetup -f) and --persistent-disks-dir; last log lines:\n{logs}")]
    DiskJob {
        /// `attach` or `release`.
        op: &'static str,
        /// The volume.
        volume: String,
        /// Its exit code.
        code: i64,
        /// The tail of its output (it handles no credential).
        logs: String,
    },
    /// A volume under a template's name is not one sandboxd may mount or
    /// replace (see [`crate::domain::template_volume::judge`]): the
    /// template's sandboxes start cold until an operator acts.
    #[error("template volume {volume} is refused: {} (its labels say deployment {deployment:?}, sandbox {sandbox:?}); sandboxes that would start from it start cold", refusal.phrase())]
    TemplateRefused {
        /// The volume's name.
        volume: String,
        /// Why.
        refusal: crate::domain::template_volume::Refusal,
        /// The deployment its labels name.
        deployment: Option<String>,
        /// The sandbox its labels name.
        sandbox: Option<String>,
    },
    /// An API call did not answer within its deadline.
    #[error("docker {op} for {target} did not answer within {after:?}; is the Docker daemon overloaded or stuck? (`docker info`, `systemctl status docker`)")]
    Timeout {
        /// What sandboxd was doing.
        op: &'static str,
        /// Container, image or network name.
        target: String,
        /// The deadline.
        after: Duration,
    },
}
