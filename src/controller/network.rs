//! Sandbox networks: one bridge per sandbox (or one shared network),
//! created again with its engines put back when it was removed out of band,
//! the orchestrator's containers attached to it, and its removal once the
//! sandbox is gone.

use super::env::Env;
use super::name_release;
use crate::config::{ControllerConfig, NetworkLayout};
use crate::domain::attach::{self, AttachError};
use crate::domain::container::ObservedContainer;
use crate::domain::id::{ContainerId, EngineName, SandboxId};
use crate::domain::identity::{self, StateId};
use crate::domain::labels;
use crate::domain::network::{bridge_name, container_name, container_name_prefix};
use crate::domain::plan::{Action, Plan};
use crate::domain::sandbox::DesiredSandbox;
use crate::ports::runtime::{BridgeOutcome, ContainerSpec, NetworkSpec, RuntimeError};
use std::collections::{BTreeSet, HashMap};

/// Where one engine container of a sandbox lives on the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The container's name.
    pub container: String,
    /// The network it joins.
    pub network: String,
    /// The name clients on that network use (published as `host`).
    pub host: String,
    /// Extra names the container answers to on the network.
    pub aliases: Vec<String>,
}

/// Where `engine` of sandbox `id` goes, the sandbox being on `network` in
/// the per-sandbox layout (see [`sandbox_network`]).
pub fn placement(
    config: &ControllerConfig,
    id: &SandboxId,
    engine: EngineName,
    network: &str,
) -> Placement {
    let container = container_name(&config.deployment, id, engine);
    match &config.network {
        NetworkLayout::PerSandbox { .. } => Placement {
            network: network.to_owned(),
            host: engine.as_str().to_owned(),
            aliases: vec![engine.as_str().to_owned()],
            container,
        },
        NetworkLayout::Shared { name } => Placement {
            network: name.clone(),
            host: container.clone(),
            aliases: Vec::new(),
            container,
        },
    }
}

/// The network the sandbox's engines are reachable on: the shared one, or
/// in the per-sandbox layout its own or the warm-pool network it adopted,
/// as its status (`recorded`) says.
pub(crate) fn sandbox_network(env: &Env, id: &SandboxId, recorded: Option<&str>) -> String {
    match &env.config.network {
        NetworkLayout::PerSandbox { .. } => {
            crate::domain::network::sandbox_network(&env.config.deployment, id, recorded)
        }
        NetworkLayout::Shared { name } => name.clone(),
    }
}

/// The shared network, created at start; `None` in the per-sandbox layout.
pub(crate) fn shared_spec(env: &Env) -> Option<NetworkSpec> {
    match &env.config.network {
        NetworkLayout::PerSandbox { .. } => None,
        NetworkLayout::Shared { name } => Some(NetworkSpec {
            name: name.clone(),
            labels: HashMap::from([(labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned())]),
            subnets: None,
            egress: true,
            bridge: None,
        }),
    }
}

/// The sandbox's own network, called `name` (its own name, or that of the
/// warm-pool network it adopted); `None` in the shared layout.
pub fn sandbox_spec(config: &ControllerConfig, id: &SandboxId, name: &str) -> Option<NetworkSpec> {
    let NetworkLayout::PerSandbox { subnets, egress } = &config.network else {
        return None;
    };
    let name = name.to_owned();
    Some(NetworkSpec {
        // Without egress the bridge is guarded on the host (see
        // `deploy/host-firewall.sh`): Docker's own isolation between
        // networks lapses for a moment whenever any network is created.
        bridge: (!*egress).then(|| bridge_name(&name)),
        name,
        labels: labels::of_sandbox(&config.deployment, id),
        subnets: Some(*subnets),
        egress: *egress,
    })
}

/// The network the sandbox's engines are on: its own `name` (labelled with
/// the state database's identity once it is known) or the shared one.
fn spec_of(env: &Env, id: &SandboxId, name: &str) -> Option<NetworkSpec> {
    match sandbox_spec(&env.config, id, name) {
        Some(mut spec) => {
            if let Some(state) = env.state.get() {
                spec.labels
                    .insert(labels::STATE_ID.to_owned(), state.to_string());
            }
            Some(spec)
        }
        None => shared_spec(env),
    }
}

/// Makes sure the sandbox's network (its own, or the shared one) exists,
/// creating it again if it was removed or pruned out of band, with
/// sandboxd's container on it when it probes by name; then puts back on it
/// every engine the plan keeps that is not on it any more, under its
/// aliases, and refreshes the host port Docker gave it anew (published
/// ports are re-bound when a container joins a network again).
pub(crate) async fn ensure(
    env: &Env,
    id: &SandboxId,
    network: &str,
    observed: &[ObservedContainer],
    plan: &mut Plan,
) -> Result<(), RuntimeError> {
    let Some(spec) = spec_of(env, id, network) else {
        return Ok(());
    };
    // Engines that ran on it (or the shared network, created at start): its
    // creation now is a re-creation.
    let was_there =
        plan.kept().next().is_some() || matches!(env.config.network, NetworkLayout::Shared { .. });
    create(env, id, &spec, was_there).await?;
    let Some(members) = env.runtime.network_members(&spec.name).await? else {
        return Ok(());
    };
    for action in plan.actions.iter_mut() {
        let Action::Keep { engine, status } = action else {
            continue;
        };
        let Some(kept) = observed
            .iter()
            .find(|c| c.labels.engine == engine.as_str() && c.labels.instance == status.instance)
        else {
            continue;
        };
        if members.contains(&kept.name) {
            continue;
        }
        // Docker takes a dying container off its networks before its list
        // shows it exited: one that is not running is left to the heal
        // that the list's next look plans (the inspect waits until Docker
        // has finished with the exit).
        if !env
            .runtime
            .inspect(&kept.id)
            .await?
            .is_some_and(|run| run.running)
        {
            tracing::debug!(sandbox = %id, engine = %engine, "engine off its network is not running: left to its heal");
            continue;
        }
        let place = placement(&env.config, id, *engine, network);
        env.runtime
            .rejoin(&place.network, &kept.id, &place.aliases)
            .await?;
        env.metrics.lifecycle.network_reconnected();
        if let Some(port) = env.runtime.published_port(&kept.id).await? {
            status.host_port = port;
        }
        tracing::warn!(sandbox = %id, engine = %engine, network = place.network, host_port = status.host_port, "engine was off its network; put back on it under its names");
    }
    Ok(())
}

/// Creates the network of `spec` unless it exists, counting a
/// re-creation, and connects sandboxd's own container to it.
async fn create(
    env: &Env,
    id: &SandboxId,
    spec: &NetworkSpec,
    recreating: bool,
) -> Result<(), RuntimeError> {
    if env.runtime.ensure_network(spec).await? && recreating {
        env.metrics.lifecycle.network_recreated();
        tracing::warn!(sandbox = %id, network = spec.name, "the network was gone (removed or pruned out of band); created it again");
    }
    if let Some(me) = &env.config.controller_container {
        env.runtime.connect(&spec.name, me).await?;
    }
    Ok(())
}

/// Creates and starts the container of `spec` (an engine of sandbox `id`);
/// when its network turns out to be gone, creates the network again and
/// tries once more. A name still held by a container Docker is removing
/// (a heal right after `docker rm -f`) is waited for, not failed on
/// ([`name_release`]).
pub(crate) async fn create_and_start(
    env: &Env,
    id: &SandboxId,
    container: &ContainerSpec,
) -> Result<ContainerId, RuntimeError> {
    let runtime = env.runtime.as_ref();
    let create_once_released = || {
        name_release::once_released(runtime, name_release::RELEASE_WITHIN, || {
            runtime.create_and_start(container)
        })
    };
    match create_once_released().await {
        Err(RuntimeError::NetworkGone { network }) => {
            tracing::warn!(sandbox = %id, network, container = container.name, "network gone at create; creating it again and retrying once");
            if let Some(spec) = spec_of(env, id, &container.network) {
                create(env, id, &spec, true).await?;
            }
            create_once_released().await
        }
        other => other,
    }
}

/// Connects the containers the row names in `attach` that may join it
/// ([`attach::judge`]) and disconnects the ones it no longer names (never
/// sandboxd's own). Returns one message per container that could not be
/// attached, each telling the orchestrator nothing about what exists.
pub(crate) async fn sync_attached(
    env: &Env,
    desired: &DesiredSandbox,
    network: &str,
) -> Result<Vec<String>, RuntimeError> {
    if !matches!(env.config.network, NetworkLayout::PerSandbox { .. }) {
        return Ok(if desired.attach.is_empty() {
            Vec::new()
        } else {
            vec!["attach: the shared network layout attaches nothing; connect the containers to the shared network yourself".to_owned()]
        });
    }
    let Some(members) = env.runtime.network_members(network).await? else {
        return Ok(Vec::new());
    };
    let own_prefix = container_name_prefix(&env.config.deployment, &desired.id);
    let wanted: BTreeSet<&str> = desired.attach.iter().map(String::as_str).collect();
    let mut problems = Vec::new();
    for name in &wanted {
        // On it already: it was judged when it was connected (a
        // container's labels, privilege, mounts and network mode are fixed
        // at its creation).
        if members.iter().any(|m| m == name) {
            continue;
        }
        if let Err(e) = attach_one(env, desired, network, name).await? {
            problems.push(e.to_string());
        }
    }
    for member in &members {
        let ours = member.starts_with(&own_prefix)
            || env.config.controller_container.as_deref() == Some(member.as_str());
        if !ours && !wanted.contains(member.as_str()) {
            env.runtime.disconnect(network, member).await?;
            tracing::info!(container = member, network, "detached");
        }
    }
    Ok(problems)
}

/// Judges the container the row names `name` and connects it (by the id
/// judged, so a container put under that name meanwhile is not the one
/// connected). The outer error is the daemon's (the whole reconcile is
/// retried); the inner one what the status says. Why a container was
/// refused, and Docker's own errors, go to the log only: they would tell
/// one tenant about containers that are not its.
async fn attach_one(
    env: &Env,
    desired: &DesiredSandbox,
    network: &str,
    name: &str,
) -> Result<Result<(), AttachError>, RuntimeError> {
    let refused = || AttachError::NotAttachable {
        name: name.to_owned(),
        owner: desired.owner.clone(),
    };
    let found = match env.runtime.attach_candidate(name).await {
        Ok(found) => found,
        Err(e @ (RuntimeError::Connect(_) | RuntimeError::Timeout { .. })) => return Err(e),
        Err(e) => {
            tracing::warn!(sandbox = %desired.id, container = name, error = %e, "could not inspect a container to attach; refused");
            return Ok(Err(refused()));
        }
    };
    let judged = match attach::judge(name, &desired.owner, found.as_ref()) {
        Ok(judged) => judged,
        Err(refusal) => {
            tracing::debug!(
                sandbox = %desired.id,
                owner = desired.owner,
                container = name,
                resolved = found.as_ref().map(|c| c.id.as_str()).unwrap_or_default(),
                reason = refusal.as_str(),
                why = refusal.phrase(),
                "attach refused"
            );
            return Ok(Err(refused()));
        }
    };
    match env.runtime.connect(network, judged.id.as_str()).await {
        Ok(()) => {
            tracing::info!(sandbox = %desired.id, container = name, network, "attached");
            Ok(Ok(()))
        }
        // The daemon is unwell: retry the whole reconcile.
        Err(e @ (RuntimeError::Connect(_) | RuntimeError::Timeout { .. })) => Err(e),
        Err(e) => {
            tracing::warn!(sandbox = %desired.id, container = name, network, error = %e, "could not connect a container to attach");
            Ok(Err(AttachError::NotConnected {
                name: name.to_owned(),
            }))
        }
    }
}

/// Removes the sandbox's network `name` (disconnecting whatever is still
/// on it), unless it carries another state database's identity `state`.
pub(crate) async fn remove(env: &Env, name: &str, state: &StateId) -> Result<(), RuntimeError> {
    if !matches!(env.config.network, NetworkLayout::PerSandbox { .. }) {
        return Ok(());
    }
    let listed = env.runtime.networks(&env.config.deployment).await?;
    if let Some(theirs) = listed
        .iter()
        .find(|n| n.name == name && !identity::resource_is_ours(n.state_id.as_deref(), state))
    {
        tracing::debug!(
            network = name,
            their_state_id = theirs.state_id.as_deref().unwrap_or_default(),
            "another state database's network: left alone"
        );
        return Ok(());
    }
    env.runtime
        .remove_network(name, &env.config.deployment)
        .await
}

/// Removes the host's stale bridges (named like sandboxd's, owned by no
/// Docker network, nothing plugged in): one that outlived its network
/// keeps its subnet's route, and every sandbox later given that subnet is
/// unreachable from the host. Each is counted; one sandboxd may not remove
/// (no CAP_NET_ADMIN) is said and left to the operator, every relist, and
/// nothing else stops (a relist never fails for it).
pub(crate) async fn remove_stale_bridges(env: &Env) {
    let swept = match env.runtime.remove_stale_bridges().await {
        Ok(swept) => swept,
        Err(e) => {
            tracing::warn!(error = %e, "could not look for stale bridges; the next relist tries again");
            return;
        }
    };
    for bridge in swept {
        let outcome = match &bridge.outcome {
            BridgeOutcome::Removed => {
                tracing::warn!(bridge = bridge.name, "removed a stale sandboxd bridge: no Docker network owned it, and its route would have made its subnet unreachable from the host");
                "removed"
            }
            BridgeOutcome::NotPermitted(why) => {
                tracing::error!(bridge = bridge.name, reason = why.as_str(), "a stale sandboxd bridge (no Docker network owns it) cannot be removed: sandboxd may not; any subnet it routes is not handed out meanwhile, but sandboxes given one before stay unreachable until an operator removes it");
                "not_permitted"
            }
            BridgeOutcome::Gone => {
                tracing::debug!(
                    bridge = bridge.name,
                    "a stale sandboxd bridge was gone by the time it was removed"
                );
                "gone"
            }
            BridgeOutcome::Failed(why) => {
                tracing::warn!(
                    bridge = bridge.name,
                    error = why.as_str(),
                    "could not remove a stale sandboxd bridge; the next relist tries again"
                );
                "failed"
            }
        };
        env.metrics.lifecycle.stale_bridge(outcome);
    }
}
