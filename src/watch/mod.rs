//! Watches as hints: Postgres NOTIFY and the Docker event stream only say
//! which sandbox to look at. Both reconnect with one backoff helper
//! ([`follow`]), and every reconnect asks for a relist, because what
//! happened while disconnected is lost (NOTIFY) or only partly replayed
//! (Docker).

mod desired;
mod docker;
mod follow;
mod known;

pub(crate) use self::desired::DesiredRows;
pub(crate) use self::docker::{DockerEvents, RemovedNetworks};
pub(crate) use self::follow::follow;
pub(crate) use self::known::KnownContainers;

use crate::domain::id::SandboxId;
use std::time::Duration;

/// What a watcher does with what it sees.
pub(crate) trait Sink: Send + Sync + 'static {
    /// A sandbox may need reconciling.
    fn hint(&self, id: SandboxId);
    /// Something new was asked of the sandbox (its desired row changed):
    /// reconcile it now, even if it is backing off after a failure.
    fn request(&self, id: SandboxId);
    /// Look at the sandbox again after `delay` (in addition to any hint).
    fn hint_later(&self, id: SandboxId, delay: Duration);
    /// The stream reconnected: anything may have been missed.
    fn relist(&self);
}
