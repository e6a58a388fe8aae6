//! The runtime itself and the host it runs on: whether it answers, what the
//! host has, and what the runtime can do beyond what every runtime does.

use super::RuntimeError;
use async_trait::async_trait;

/// What a runtime can do beyond the methods every runtime has: each
/// adapter declares its own, and the controller decides by them alone, so
/// a new backend (say, Kubernetes) says what it can and the controller
/// follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// A running container can join another network under new aliases
    /// ([`Networks::rejoin`](super::Networks::rejoin)). A Swarm task cannot (its networks are fixed
    /// at creation): a pool container is then claimed only by a sandbox
    /// that adopts its network.
    pub rejoins: bool,
    /// A running container can be renamed ([`Containers::rename`](super::Containers::rename)), so a
    /// rotation builds the new container beside the old one and gives it
    /// the old one's name afterwards. A Swarm service cannot: it rotates
    /// in place (the old container first, then the new one).
    pub renames: bool,
    /// A container can start from a volume this host copied from another
    /// container, which seeds' templates are. Under Swarm a task may run
    /// on a node that has no such copy: seeds are loaded instead.
    pub local_copies: bool,
}

impl Capabilities {
    /// Everything (one Docker engine).
    pub const ALL: Capabilities = Capabilities {
        rejoins: true,
        renames: true,
        local_copies: true,
    };
}

/// The runtime as a whole, and its host.
#[async_trait]
pub trait Host: Send + Sync {
    /// Whether the daemon answers.
    async fn ping(&self) -> Result<(), RuntimeError>;
    /// The host's memory in bytes, as the daemon reports it (`docker
    /// info`'s total memory); `None` when it does not say.
    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        Ok(None)
    }
    /// The OCI runtimes the daemon can run containers under, by name
    /// (`docker info`'s Runtimes); `None` when it does not say. One that
    /// cannot choose a runtime per container (Swarm) has none.
    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        Ok(None)
    }
    /// What this runtime can do beyond the methods every runtime has
    /// (default: everything). The controller asks this, never which
    /// backend it runs on.
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }
}
