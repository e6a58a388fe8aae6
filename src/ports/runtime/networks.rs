//! Networks for sandbox containers: made, listed, removed, joined and left;
//! the host's side of them (its bridges and routes); and the stream of
//! their removals.

use super::{ObservedResource, RuntimeError};
use crate::domain::attach::Candidate;
use crate::domain::host_net::RouteConflict;
use crate::domain::id::{ContainerId, Deployment};
use crate::domain::network::SubnetPool;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::collections::HashMap;

/// A network for sandbox containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSpec {
    /// Network name.
    pub name: String,
    /// Labels (deployment and sandbox, so that it is found and cleaned up).
    pub labels: HashMap<String, String>,
    /// Where its subnet comes from; `None` lets the daemon choose.
    pub subnets: Option<SubnetPool>,
    /// Whether its containers may reach beyond the host through NAT.
    pub egress: bool,
    /// The Linux bridge's name; `None` lets the daemon choose.
    pub bridge: Option<String>,
}

/// What became of one stale bridge (a Linux bridge named like sandboxd's
/// that no Docker network owns; see [`crate::domain::host_net`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeOutcome {
    /// It was removed, and its route with it.
    Removed,
    /// This process may not remove it (no CAP_NET_ADMIN, or no `ip`):
    /// the reason says what the operator does instead.
    NotPermitted(String),
    /// It was gone by the time it was removed (Docker removed it with
    /// its network meanwhile).
    Gone,
    /// Removing it failed otherwise.
    Failed(String),
}

/// A stale bridge a sweep found, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleBridge {
    /// The bridge's name.
    pub name: String,
    /// What became of it.
    pub outcome: BridgeOutcome,
}

/// A stream of network names; it ends (or yields an error) when the
/// connection drops.
pub type NetworkStream = BoxStream<'static, Result<String, RuntimeError>>;

/// The runtime's networks, and which containers are on them.
#[async_trait]
pub trait Networks: Send + Sync {
    /// Creates the network unless one of that name exists (true when it
    /// created it); a per-sandbox network takes the first free subnet of
    /// its pool.
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError>;
    /// Removes the host's Linux bridges named like sandboxd's (`sbx…`)
    /// that no Docker network of any kind owns and nothing is plugged
    /// into: one that outlived its network keeps its subnet's route, and a
    /// network given that subnet is unreachable from the host. Runtimes
    /// without host bridges (or that cannot see the host's) find none.
    async fn remove_stale_bridges(&self) -> Result<Vec<StaleBridge>, RuntimeError> {
        Ok(Vec::new())
    }
    /// Why the host cannot reach the container `id` on a network of its,
    /// if the host's route for its address goes through another interface
    /// than that network's bridge (`None`: it does not, or the runtime
    /// cannot tell).
    async fn route_conflict(
        &self,
        _id: &ContainerId,
    ) -> Result<Option<RouteConflict>, RuntimeError> {
        Ok(None)
    }
    /// The networks `deployment` created.
    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError>;
    /// Disconnects everything from the network `name` and removes it, if it
    /// exists and its labels say `deployment` created it. Idempotent.
    async fn remove_network(&self, name: &str, deployment: &Deployment)
        -> Result<(), RuntimeError>;
    /// Names of the containers connected to the network; `None` if it does
    /// not exist.
    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError>;
    /// What the runtime says of the container it resolves `name` to: an
    /// exact name, but as Docker resolves them also a full id or a unique
    /// id prefix (the judgement, [`crate::domain::attach::judge`], compares
    /// the name); `None` when it resolves to none.
    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError>;
    /// Connects the container `container` (sandboxd's own container by
    /// name, or an attach candidate by its full id) to `network`. Checks
    /// nothing: an orchestrator's container is judged first
    /// ([`crate::domain::attach`]). Already connected is success.
    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError>;
    /// Disconnects the container from `network`. Not connected is success.
    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError>;
    /// Makes the sandboxd container `id`, already on `network`, answer to
    /// `aliases` there. Docker cannot change an endpoint's aliases, so the
    /// container is disconnected and connected again: its published port
    /// is bound anew (to another host port unless the container asked for
    /// a fixed one).
    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError>;
    /// The names of networks as they are removed, any owner's (Docker's
    /// network events carry no labels: the watcher picks its own by name).
    fn removed_networks(&self) -> NetworkStream;
}
