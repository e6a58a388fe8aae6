//! The warm pool: per engine and feature set, ready containers nobody has
//! claimed yet, started with a random pool password that lives only in
//! this process's memory. A provision whose engine and feature set match
//! claims one ([`claim`]): the claim is recorded in the state database
//! first (Docker labels cannot change), then the claimant's credentials are
//! set inside the container (on standard input), the container takes the
//! sandbox's container name and joins its network under the engine's host
//! name, and it is probed with the new credentials. Each pool container
//! waits on a network of its own, which it keeps when it is claimed (it is
//! alone there): leaving a network costs Docker more than joining one, and
//! a claim never waits for it. The pool is refilled in
//! the background ([`refill_loop`]), never above its size and only while no
//! request waits for a worker. Only the leader runs it: every Docker call
//! goes through the fenced runtime, and a new term starts from what it
//! lists ([`start_term`]).

use super::network::{self, Placement};
use super::provision::{self, bring_up, container_spec, new_instance};
use super::{Context, ControllerError};
use crate::config::NetworkLayout;
use crate::domain::container::{ContainerState, ObservedContainer};
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::labels;
use crate::domain::network::bridge_name;
use crate::domain::plan::Provision;
use crate::domain::pool::{self, ClaimIndex, PoolClaim, PoolKey, PooledContainer};
use crate::domain::sandbox::{DesiredSandbox, ServiceStatus};
use crate::domain::secret::Secret;
use crate::engine::{Credentials, Engine};
use crate::ports::runtime::{NetworkSpec, ObservedResource, RuntimeError};
use crate::sched::WorkQueue;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Pool containers started at once per pool.
const AT_ONCE: usize = 1;
/// How often the refill looks without being woken.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Why a pool container could not be had or claimed (logged; the cold
/// path serves the sandbox meanwhile).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    /// Docker failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The state database failed.
    #[error(transparent)]
    Store(#[from] crate::ports::store::StoreError),
    /// This process does not lead (any more).
    #[error(transparent)]
    Fenced(#[from] super::Fenced),
    /// Starting or probing a pool container failed.
    #[error(transparent)]
    Provision(#[from] Box<provision::ProvisionError>),
    /// Setting the claimant's credentials failed.
    #[error("setting the claimant's credentials in pool container {container} failed (exit {exit_code}); the container was removed and the sandbox is provisioned cold")]
    Credentials {
        /// The container.
        container: String,
        /// The command's exit code.
        exit_code: i64,
    },
}

/// A ready, unclaimed pool container.
#[derive(Debug, Clone)]
struct Ready {
    id: ContainerId,
    /// The pool password: known to this process only.
    credentials: Credentials,
    /// Its own pool network.
    network: String,
}

#[derive(Debug, Default)]
struct PoolState {
    ready: BTreeMap<PoolKey, Vec<Ready>>,
    creating: BTreeMap<PoolKey, usize>,
}

/// The warm pool's memory (a cache: claims live in the state database,
/// containers in Docker).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    /// Claims read back or made, by container.
    claims: Mutex<HashMap<ContainerId, PoolClaim>>,
    /// Which sandbox each claimed container serves (for the event watcher).
    pub(crate) index: Arc<ClaimIndex>,
    /// Wakes the refill.
    wake: Notify,
    /// Pool networks whose container is being created (not orphans).
    creating_networks: Mutex<HashSet<String>>,
}

impl Pool {
    fn take(&self, key: &PoolKey) -> Option<Ready> {
        self.state.lock().unwrap().ready.get_mut(key)?.pop()
    }

    fn remember_claim(&self, claim: PoolClaim) {
        self.index
            .insert(claim.container.clone(), claim.sandbox.clone());
        self.claims
            .lock()
            .unwrap()
            .insert(claim.container.clone(), claim);
    }

    fn forget_claim(&self, container: &ContainerId) {
        self.index.remove(container);
        self.claims.lock().unwrap().remove(container);
    }

    fn claims_of(&self, sandbox: &SandboxId) -> Vec<PoolClaim> {
        self.claims
            .lock()
            .unwrap()
            .values()
            .filter(|c| &c.sandbox == sandbox)
            .cloned()
            .collect()
    }

    fn report(&self, ctx: &Context) {
        let st = self.state.lock().unwrap();
        let mut by_engine: BTreeMap<_, (usize, usize)> = BTreeMap::new();
        for key in ctx.config.warm_pool.keys() {
            let e = by_engine.entry(key.engine).or_default();
            e.0 += st.ready.get(key).map_or(0, Vec::len);
            e.1 += st.creating.get(key).copied().unwrap_or(0);
        }
        for (engine, (ready, creating)) in by_engine {
            ctx.metrics.pool_size(engine, ready, creating);
        }
    }
}

/// What every pool network of the deployment is called up to its
/// container's token (a name no sandbox network can have).
fn network_prefix(ctx: &Context) -> String {
    format!("sandboxd-pool.{}.", ctx.config.deployment)
}

/// The network the pool container with `token` waits on: its own, internal
/// like sandbox networks (or the shared network of the shared layout).
fn network_name(ctx: &Context, token: &str) -> String {
    match &ctx.config.network {
        NetworkLayout::PerSandbox { .. } => format!("{}{token}", network_prefix(ctx)),
        NetworkLayout::Shared { name } => name.clone(),
    }
}

fn network_spec(ctx: &Context, name: &str) -> Option<NetworkSpec> {
    let NetworkLayout::PerSandbox { subnets, egress } = &ctx.config.network else {
        return None;
    };
    let name = name.to_owned();
    let mut labels = HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            ctx.config.deployment.to_string(),
        ),
        (pool::POOL.to_owned(), "1".to_owned()),
    ]);
    if let Some(state) = ctx.state.get() {
        labels.insert(labels::STATE_ID.to_owned(), state.to_string());
    }
    Some(NetworkSpec {
        bridge: (!*egress).then(|| bridge_name(&name)),
        name,
        labels,
        subnets: Some(*subnets),
        egress: *egress,
    })
}

/// Serves `p` from the pool if it may claim and a container of its engine
/// and feature set is ready; `None` sends it down the cold path (nothing
/// of the sandbox was changed, and a container a failed claim changed is
/// removed).
pub(crate) async fn claim(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    credentials: &Credentials,
    image: &str,
) -> Option<(ContainerId, ServiceStatus)> {
    let kind = pool::claim_kind(p.reason, desired.persistent, p.retire.is_some())?;
    let key = PoolKey {
        engine: p.engine,
        features: p.features.clone(),
    };
    if !ctx.config.warm_pool.contains_key(&key) {
        return None;
    }
    let started = Instant::now();
    let Some(ready) = ctx.pool.take(&key) else {
        ctx.metrics.pool_claim(p.engine, kind, None);
        ctx.pool.wake.notify_one();
        return None;
    };
    ctx.pool.report(ctx);
    ctx.pool.wake.notify_one();
    match take_over(ctx, desired, engine, p, &ready, credentials, image).await {
        Ok(claimed) => {
            let took = started.elapsed();
            ctx.metrics.pool_claim(p.engine, kind, Some(took));
            tracing::info!(
                container = %claimed.0,
                kind = kind.as_str(),
                elapsed_ms = took.as_millis() as u64,
                "served from the warm pool"
            );
            Some(claimed)
        }
        Err(e) => {
            ctx.metrics.pool_claim(p.engine, kind, None);
            tracing::warn!(container = %ready.id, error = %e, "warm-pool claim failed; removing the container and provisioning cold");
            if let Err(e) = ctx.runtime.remove(&ready.id, Duration::ZERO).await {
                tracing::warn!(container = %ready.id, error = %e, "could not remove the pool container; the next relist will");
            } else if let Ok(term) = ctx.term() {
                if ctx.store.delete_claim(&ready.id, term).await.is_ok() {
                    ctx.pool.forget_claim(&ready.id);
                }
            }
            None
        }
    }
}

/// Records the claim, then sets the credentials, renames, moves the
/// container to the sandbox's network and probes it.
async fn take_over(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    ready: &Ready,
    credentials: &Credentials,
    image: &str,
) -> Result<(ContainerId, ServiceStatus), PoolError> {
    let runtime = ctx.runtime.as_ref();
    let id = &ready.id;
    let command = engine
        .claim(&ready.credentials, credentials)
        .ok_or_else(|| PoolError::Credentials {
            container: id.to_string(),
            exit_code: -1,
        })?;
    let instance = new_instance();
    let claim = PoolClaim {
        container: id.clone(),
        sandbox: desired.id.clone(),
        engine: p.engine.as_str().to_owned(),
        generation: desired.generation,
        incarnation: desired.incarnation.as_ref().map(ToString::to_string),
        owner: desired.owner.clone(),
        features: p.features.clone(),
        instance: instance.clone(),
    };
    // Before the container changes: a crash from here on leaves a container
    // that maps to its sandbox with an instance never published.
    ctx.store.record_claim(&claim, ctx.term()?).await?;
    ctx.pool.remember_claim(claim);

    let cmd: Vec<&str> = command.cmd.iter().map(String::as_str).collect();
    let placement: Placement = network::placement(&ctx.config, &desired.id, p.engine);
    // The credentials, the container's name and its network are
    // independent: changed at once (all done before anything is
    // published). It stays on its own pool network, where it is alone.
    let set_credentials = async {
        let out = runtime.exec_stdin(id, &cmd, &command.stdin).await?;
        if (command.succeeded)(&out) {
            Ok(())
        } else {
            Err(PoolError::Credentials {
                container: id.to_string(),
                exit_code: out.exit_code,
            })
        }
    };
    let rename = async {
        runtime.rename(id, &placement.container).await?;
        Ok::<(), PoolError>(())
    };
    let join = async {
        if placement.network != ready.network {
            runtime
                .rejoin(&placement.network, id, &placement.aliases)
                .await?;
        }
        Ok::<(), PoolError>(())
    };
    tokio::try_join!(set_credentials, rename, join)?;
    let (host_port, available) = bring_up(
        ctx,
        engine,
        id,
        &placement.container,
        credentials,
        &p.features,
        image,
    )
    .await
    .map_err(Box::new)?;
    let status = provision::ready_status(
        ctx,
        engine,
        p,
        placement.host,
        host_port,
        credentials.clone(),
        available,
        instance,
    );
    Ok((id.clone(), status))
}

/// The claimed pool containers of `sandbox`, as the planner sees them;
/// claims whose container is gone are deleted.
pub(crate) async fn observed_of(
    ctx: &Context,
    sandbox: &SandboxId,
) -> Result<Vec<ObservedContainer>, ControllerError> {
    let claims = ctx.pool.claims_of(sandbox);
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let listed = ctx.runtime.pool_containers(&ctx.config.deployment).await?;
    Ok(match_claims(ctx, claims, &listed).await)
}

/// What a relist sees of the pool: every claimed pool container as the
/// planner sees it, and every pool container's state (for the drift
/// count: the event stream reports them too). The pool's memory is
/// brought in line with what is listed.
pub(crate) async fn relisted(
    ctx: &Context,
    networks: &[ObservedResource],
) -> Result<Relisted, ControllerError> {
    if ctx.config.warm_pool.is_empty() && ctx.pool.claims.lock().unwrap().is_empty() {
        return Ok(Relisted::default());
    }
    let listed = ctx.runtime.pool_containers(&ctx.config.deployment).await?;
    {
        // A ready container that died or vanished is no longer ready.
        let mut st = ctx.pool.state.lock().unwrap();
        for entries in st.ready.values_mut() {
            entries.retain(|r| {
                listed
                    .iter()
                    .any(|l| l.id == r.id && l.state == ContainerState::Running)
            });
        }
    }
    ctx.pool.report(ctx);
    remove_orphan_networks(ctx, &listed, networks).await?;
    let claims: Vec<PoolClaim> = ctx.pool.claims.lock().unwrap().values().cloned().collect();
    Ok(Relisted {
        claimed: match_claims(ctx, claims, &listed).await,
        states: listed.iter().map(|l| (l.id.clone(), l.state)).collect(),
    })
}

/// Removes the pool networks (of the deployment's `networks`) whose
/// container is gone (claimed or not) and that nothing is connected to any
/// more. One that cannot be removed now is left for the next relist.
async fn remove_orphan_networks(
    ctx: &Context,
    listed: &[PooledContainer],
    networks: &[ObservedResource],
) -> Result<(), RuntimeError> {
    if !matches!(ctx.config.network, NetworkLayout::PerSandbox { .. }) {
        return Ok(());
    }
    let prefix = network_prefix(ctx);
    for n in networks {
        let Some(token) = n.name.strip_prefix(&prefix) else {
            continue;
        };
        let in_use = listed
            .iter()
            .any(|c| c.instance.eq_ignore_ascii_case(token))
            || ctx.pool.creating_networks.lock().unwrap().contains(&n.name);
        if in_use {
            continue;
        }
        let members = ctx.runtime.network_members(&n.name).await?;
        let alone = members.is_none_or(|m| {
            m.iter()
                .all(|c| ctx.config.controller_container.as_deref() == Some(c.as_str()))
        });
        if !alone {
            continue;
        }
        match ctx
            .runtime
            .remove_network(&n.name, &ctx.config.deployment)
            .await
        {
            Ok(()) => {
                tracing::debug!(
                    network = n.name,
                    "removed the network of a pool container that is gone"
                )
            }
            Err(e) => {
                tracing::warn!(network = n.name, error = %e, "could not remove the network of a pool container that is gone; the next relist tries again")
            }
        }
    }
    Ok(())
}

/// What a relist sees of the pool (see [`relisted`]).
#[derive(Debug, Default)]
pub(crate) struct Relisted {
    /// Claimed pool containers, as their sandboxes' containers.
    pub(crate) claimed: Vec<ObservedContainer>,
    /// Every pool container's state.
    pub(crate) states: Vec<(ContainerId, ContainerState)>,
}

async fn match_claims(
    ctx: &Context,
    claims: Vec<PoolClaim>,
    listed: &[PooledContainer],
) -> Vec<ObservedContainer> {
    let mut seen = Vec::new();
    for claim in claims {
        match listed.iter().find(|l| l.id == claim.container) {
            Some(l) => seen.push(claim.observed(l)),
            None => {
                // Removed (torn down, replaced, or by hand): the claim goes.
                if let Ok(term) = ctx.term() {
                    match ctx.store.delete_claim(&claim.container, term).await {
                        Ok(()) => ctx.pool.forget_claim(&claim.container),
                        Err(e) => {
                            tracing::warn!(container = %claim.container, error = %e, "could not delete the claim of a removed pool container")
                        }
                    }
                }
            }
        }
    }
    seen
}

/// A new term starts its pool from what it lists: the recorded claims
/// are read back (those of removed containers deleted), and unclaimed pool
/// containers whose password this process does not know are removed (the
/// refill replaces them).
pub(crate) async fn start_term(ctx: &Context) -> Result<(), ControllerError> {
    let state = ctx.state_id().await?.to_string();
    let claims = ctx.store.pool_claims().await?;
    ctx.pool.index.replace(&claims);
    *ctx.pool.claims.lock().unwrap() = claims
        .iter()
        .map(|c| (c.container.clone(), c.clone()))
        .collect();
    let listed = ctx.runtime.pool_containers(&ctx.config.deployment).await?;
    let claimed: Vec<PoolClaim> = claims.clone();
    match_claims(ctx, claimed, &listed).await;
    let known: Vec<ContainerId> = {
        let mut st = ctx.pool.state.lock().unwrap();
        // Creations of an earlier term were abandoned with it.
        st.creating.clear();
        for entries in st.ready.values_mut() {
            entries.retain(|r| {
                listed
                    .iter()
                    .any(|l| l.id == r.id && l.state == ContainerState::Running)
            });
        }
        st.ready.values().flatten().map(|r| r.id.clone()).collect()
    };
    for l in &listed {
        let claimed = claims.iter().any(|c| c.container == l.id);
        let ours = l.state_id.as_deref() == Some(state.as_str());
        if claimed || known.contains(&l.id) || !ours {
            continue;
        }
        tracing::info!(container = %l.id, name = l.name, "removing an unclaimed pool container whose password this process does not know");
        ctx.runtime.remove(&l.id, Duration::ZERO).await?;
    }
    ctx.pool.report(ctx);
    Ok(())
}

/// Keeps every configured pool at its size while this process leads:
/// starts at most [`AT_ONCE`] container per pool at a time, and none
/// while a sandbox waits for a worker.
pub(crate) async fn refill_loop(ctx: Arc<Context>, queue: WorkQueue<crate::domain::id::SandboxId>) {
    if ctx.config.warm_pool.is_empty() {
        return;
    }
    loop {
        let busy = queue.due() > 0;
        for (key, size) in &ctx.config.warm_pool {
            let n = {
                let mut st = ctx.pool.state.lock().unwrap();
                let ready = st.ready.get(key).map_or(0, Vec::len);
                let creating = st.creating.get(key).copied().unwrap_or(0);
                let n = pool::to_start(*size, ready, creating, AT_ONCE, busy);
                *st.creating.entry(key.clone()).or_default() += n;
                n
            };
            for _ in 0..n {
                let ctx = ctx.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let result = fill_one(&ctx, &key).await;
                    let mut st = ctx.pool.state.lock().unwrap();
                    if let Some(c) = st.creating.get_mut(&key) {
                        *c = c.saturating_sub(1);
                    }
                    match result {
                        Ok(ready) => st.ready.entry(key.clone()).or_default().push(ready),
                        Err(e) => {
                            tracing::warn!(pool = %key, error = %e, "could not start a warm-pool container; trying again later")
                        }
                    }
                    drop(st);
                    ctx.pool.report(&ctx);
                    ctx.pool.wake.notify_one();
                });
            }
        }
        ctx.pool.report(&ctx);
        tokio::select! {
            () = ctx.pool.wake.notified() => {}
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        // A failing refill must not spin.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates, starts and probes one pool container of `key`.
async fn fill_one(ctx: &Context, key: &PoolKey) -> Result<Ready, PoolError> {
    let engine = ctx
        .engines
        .get(key.engine)
        .ok_or(provision::ProvisionError::UnknownEngine(key.engine))
        .map_err(Box::new)?;
    let image = ctx
        .config
        .images
        .image_for(engine, !key.features.is_empty());
    let credentials = engine.credentials(Secret::generate());
    let token = new_instance();
    let name = format!(
        "sandboxd-pool.{}.{}.{}",
        ctx.config.deployment,
        key.engine,
        token.to_ascii_lowercase()
    );
    let placement = Placement {
        container: name.clone(),
        network: network_name(ctx, &token.to_ascii_lowercase()),
        host: name.clone(),
        aliases: Vec::new(),
    };
    ctx.pool
        .creating_networks
        .lock()
        .unwrap()
        .insert(placement.network.clone());
    let started = start_one(ctx, engine, key, &image, &credentials, token, &placement).await;
    ctx.pool
        .creating_networks
        .lock()
        .unwrap()
        .remove(&placement.network);
    let id = started?;
    match bring_up(ctx, engine, &id, &name, &credentials, &key.features, &image).await {
        Ok(_) => {
            tracing::info!(pool = %key, container = %id, "warm-pool container ready");
            Ok(Ready {
                id,
                credentials,
                network: placement.network,
            })
        }
        Err(e) => {
            let _ = ctx.runtime.remove(&id, Duration::ZERO).await;
            Err(PoolError::Provision(Box::new(e)))
        }
    }
}

/// Creates the pool network of `placement` and starts a pool container of
/// `key` on it.
async fn start_one(
    ctx: &Context,
    engine: &'static dyn Engine,
    key: &PoolKey,
    image: &str,
    credentials: &Credentials,
    token: String,
    placement: &Placement,
) -> Result<ContainerId, PoolError> {
    if let Some(spec) = network_spec(ctx, &placement.network) {
        ctx.runtime.ensure_network(&spec).await?;
    }
    let features: Vec<&str> = key.features.iter().map(String::as_str).collect();
    let mut labels = HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            ctx.config.deployment.to_string(),
        ),
        (labels::ENGINE.to_owned(), key.engine.as_str().to_owned()),
        (labels::FEATURES.to_owned(), features.join(",")),
        (labels::INSTANCE.to_owned(), token),
        (pool::POOL.to_owned(), "1".to_owned()),
    ]);
    if let Some(state) = ctx.state.get() {
        labels.insert(labels::STATE_ID.to_owned(), state.to_string());
    }
    if let Some(term) = ctx.fence.term() {
        labels.insert(crate::domain::lease::TERM_LABEL.into(), term.to_string());
    }
    let mut spec = container_spec(
        &ctx.config,
        engine,
        placement,
        image,
        credentials,
        &key.features,
        labels,
        None,
    );
    spec.cmd.extend(engine.pool_args(credentials));
    super::template::apply(ctx, engine, &key.features, &mut spec).await;
    Ok(ctx.runtime.create_and_start(&spec).await?)
}
