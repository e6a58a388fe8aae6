//! The warm pool: per engine and feature set, ready containers nobody has
//! claimed yet, started with a random pool password that lives only in
//! this process's memory, each on a network of its own under its engine's
//! host name. A reconcile reserves one for each provision whose engine and
//! feature set match ([`reserve`]), and a sandbox that has no network yet
//! adopts the first one's: its claim then creates no network and joins
//! none. The claim ([`claim`]) is recorded in the state database first
//! (Docker labels cannot change), then the claimant's credentials are set
//! over the engine's own protocol while the container takes the sandbox's
//! container name; a container claimed into a sandbox that already has a
//! network joins it under the engine's host name (and keeps its own, where
//! it is alone: leaving a network costs Docker more than joining one). It
//! is probed with the new credentials. The pool is refilled in the
//! background ([`refill_loop`]), never above its size and only while no
//! request waits for a worker. Only the leader runs it: every Docker call
//! goes through the fenced runtime, and a new term starts from what it
//! lists ([`start_term`]).

use super::bring_up::{
    bring_up, bring_up_at, claim_credentials, container_spec, new_instance, probe_address,
    ready_status, ProvisionError,
};
use super::network::{self, Placement};
use super::seed_template;
use super::{Context, ControllerError};
use crate::config::{NetworkLayout, ProbeVia};
use crate::domain::container::{ContainerState, ObservedContainer};
use crate::domain::crash_loop::{self, CrashLoopPolicy, HealGate};
use crate::domain::id::{ContainerId, EngineName, SandboxId};
use crate::domain::labels;
use crate::domain::network::{bridge_name, pool_network_prefix};
use crate::domain::plan::{Plan, Provision};
use crate::domain::pool::{self, demand, ClaimIndex, PoolClaim, PoolKey, PooledContainer};
use crate::domain::sandbox::{DesiredSandbox, ServiceStatus};
use crate::domain::secret::Secret;
use crate::domain::seed::SeedHash;
use crate::engine::{Credentials, Engine};
use crate::ports::runtime::{NetworkSpec, ObservedResource, RuntimeError, Volume};
use crate::sched::WorkQueue;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Pool containers started at once per pool.
const AT_ONCE: usize = 1;
/// How often the refill looks without being woken.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// Failed starts remembered per pool (enough to reach the back-off's cap).
const FAILURES_KEPT: usize = 32;

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
    Provision(#[from] Box<ProvisionError>),
    /// Setting the claimant's credentials failed.
    #[error("pool container {container}: {source}; the container is removed and the sandbox provisioned cold")]
    Credentials {
        /// The container.
        container: String,
        /// What the engine said.
        #[source]
        source: crate::engine::EngineError,
    },
}

impl PoolError {
    /// The seed the pool's containers start from, when it is what failed:
    /// its content (the engine refused it, or it ran out of time) or its
    /// registration (deleted, or another engine's). A pool of that seed
    /// stops (see [`Pool::started`]); anything else only backs off.
    fn failed_seed(&self) -> Option<&SeedHash> {
        use super::seed::SeedError as S;
        let PoolError::Provision(e) = self else {
            return None;
        };
        match &**e {
            ProvisionError::Seed(
                S::Unknown(hash)
                | S::WrongEngine { hash, .. }
                | S::Engine { hash, .. }
                | S::Timeout { hash },
            ) => Some(hash),
            _ => None,
        }
    }
}

/// How long setting a claimant's credentials may take.
const CLAIM_DEADLINE: Duration = Duration::from_secs(10);

/// A ready, unclaimed pool container.
#[derive(Debug, Clone)]
struct Ready {
    id: ContainerId,
    /// The pool password: known to this process only.
    credentials: Credentials,
    /// Its own pool network.
    network: String,
    /// Its name.
    name: String,
    /// The host port its engine port is published on.
    host_port: u16,
}

#[derive(Debug, Default)]
struct PoolState {
    ready: BTreeMap<PoolKey, Vec<Ready>>,
    creating: BTreeMap<PoolKey, usize>,
    /// When each engine and feature set was requested (for the pools
    /// learned from demand; only within the window).
    asks: demand::Asks,
    /// When each pool's starts failed lately (within the crash-loop
    /// window): a pool that keeps failing starts again only after a
    /// growing delay, as a crash-looping engine is healed
    /// ([`crash_loop::gate`]). A start that comes up forgets them.
    failed: BTreeMap<PoolKey, Vec<DateTime<Utc>>>,
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

    /// Records a request for `key` at `now`, forgetting requests older
    /// than `window`.
    fn ask(&self, key: &PoolKey, now: DateTime<Utc>, window: Duration) {
        let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
        let mut st = self.state.lock().unwrap();
        st.asks.retain(|_, times| {
            times.retain(|t| now.signed_duration_since(*t) <= window);
            !times.is_empty()
        });
        st.asks.entry(key.clone()).or_default().push(now);
    }

    /// Records how a start of `key` ended at `now`. A failure counts
    /// towards the pool's back-off; one of its seed stops a learned pool
    /// (its requests are forgotten: the next request of the seed starts
    /// it again, still backing off). Whether the pool stopped.
    fn started(
        &self,
        key: &PoolKey,
        failed: Option<&PoolError>,
        now: DateTime<Utc>,
        policy: &CrashLoopPolicy,
    ) -> bool {
        let mut st = self.state.lock().unwrap();
        let Some(e) = failed else {
            st.failed.remove(key);
            return false;
        };
        let window = chrono::Duration::from_std(policy.window).unwrap_or(chrono::Duration::MAX);
        let times = st.failed.entry(key.clone()).or_default();
        times.retain(|t| now.signed_duration_since(*t) <= window);
        // Only the recent ones count; a bound keeps a long failure cheap.
        if times.len() >= FAILURES_KEPT {
            times.remove(0);
        }
        times.push(now);
        // Forget failures of pools long gone (their times are all old).
        st.failed.retain(|_, times| {
            times
                .iter()
                .any(|t| now.signed_duration_since(*t) <= window)
        });
        e.failed_seed().is_some() && st.asks.remove(key).is_some()
    }

    /// Whether `key`'s pool backs off at `now` after failed starts.
    fn backing_off(
        st: &PoolState,
        key: &PoolKey,
        now: DateTime<Utc>,
        policy: &CrashLoopPolicy,
    ) -> bool {
        st.failed
            .get(key)
            .is_some_and(|times| crash_loop::gate(times, now, policy) != HealGate::Now)
    }

    /// Every pool's size now: those configured, and those learned from
    /// the requests of the window ([`demand::sizes`]).
    fn targets(&self, ctx: &Context) -> BTreeMap<PoolKey, usize> {
        let mut targets = ctx.config.warm_pool.clone();
        let learned = &ctx.config.warm_pool_demand;
        if learned.is_on() {
            let st = self.state.lock().unwrap();
            targets.extend(demand::sizes(
                &st.asks,
                ctx.clock.now(),
                learned.window,
                learned.max,
                &ctx.config.warm_pool,
            ));
        }
        targets
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

    /// Each pool with a target, a ready or a starting container, for the
    /// operator page.
    pub(crate) fn view(&self, ctx: &Context) -> Vec<crate::ports::PoolView> {
        let targets = self.targets(ctx);
        let st = self.state.lock().unwrap();
        let keys: std::collections::BTreeSet<&PoolKey> = targets
            .keys()
            .chain(st.ready.keys())
            .chain(st.creating.keys())
            .collect();
        keys.into_iter()
            .map(|key| crate::ports::PoolView {
                pool: key.to_string(),
                ready: st.ready.get(key).map_or(0, Vec::len),
                starting: st.creating.get(key).copied().unwrap_or(0),
                target: targets.get(key).copied().unwrap_or(0),
            })
            .collect()
    }

    fn report(&self, ctx: &Context) {
        let st = self.state.lock().unwrap();
        let mut by_engine: BTreeMap<_, (usize, usize)> = BTreeMap::new();
        for engine in ctx.config.warm_pool.keys().map(|k| k.engine) {
            by_engine.entry(engine).or_default();
        }
        let keys: std::collections::BTreeSet<&PoolKey> =
            st.ready.keys().chain(st.creating.keys()).collect();
        for key in keys {
            let e = by_engine.entry(key.engine).or_default();
            e.0 += st.ready.get(key).map_or(0, Vec::len);
            e.1 += st.creating.get(key).copied().unwrap_or(0);
        }
        for (engine, (ready, creating)) in by_engine {
            ctx.metrics.pool.size(engine, ready, creating);
        }
    }
}

/// The network the pool container with `token` waits on: its own, internal
/// like sandbox networks (or the shared network of the shared layout).
fn network_name(ctx: &Context, token: &str) -> String {
    match &ctx.config.network {
        NetworkLayout::PerSandbox { .. } => {
            format!("{}{token}", pool_network_prefix(&ctx.config.deployment))
        }
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

/// The ready warm-pool containers one reconcile took for its provisions,
/// by engine. Each is claimed by its engine's provision ([`claim`]); what
/// is left when it is dropped (the reconcile failed or was cut off first)
/// goes back to the pool.
pub(crate) struct Reserved<'a> {
    pool: &'a Pool,
    entries: Mutex<BTreeMap<EngineName, (PoolKey, Ready)>>,
}

impl<'a> Reserved<'a> {
    /// Nothing reserved.
    pub(crate) fn none(pool: &'a Pool) -> Self {
        Self {
            pool,
            entries: Mutex::default(),
        }
    }

    /// The pool network of the first reserved container: a sandbox that
    /// has no network yet adopts it, so that its first claim neither
    /// creates a network nor joins one.
    pub(crate) fn network(&self) -> Option<String> {
        let entries = self.entries.lock().unwrap();
        let (_, ready) = entries.values().next()?;
        Some(ready.network.clone())
    }

    fn take(&self, engine: EngineName) -> Option<(PoolKey, Ready)> {
        self.entries.lock().unwrap().remove(&engine)
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let entries = std::mem::take(self.entries.get_mut().unwrap());
        if entries.is_empty() {
            return;
        }
        let mut st = self.pool.state.lock().unwrap();
        for (_, (key, ready)) in entries {
            st.ready.entry(key).or_default().push(ready);
        }
    }
}

/// Whether `desired` runs under the pool's isolation level: a pool's
/// containers run under the controller's `--runtime`, so a sandbox whose
/// row raises its level (a gVisor sandbox under runc pools) never claims
/// one.
fn same_isolation(ctx: &Context, desired: &DesiredSandbox) -> bool {
    desired.isolation_under(ctx.config.isolation) == ctx.config.isolation
}

/// Reserves a ready pool container for each provision of `plan` that may
/// claim one (see [`pool::claim_kind`]) and whose engine and feature set
/// has a pool; one that finds its pool empty is counted as a miss and
/// wakes the refill. `adopts`: the sandbox has no network yet and would
/// adopt the first reserved container's. Where a running container cannot
/// join another network (a Swarm task, see [`Runtime::rejoins`]), only
/// such a sandbox claims, and only one container: the one whose network
/// it adopts.
///
/// [`Runtime::rejoins`]: crate::ports::runtime::Runtime::rejoins
pub(crate) fn reserve<'a>(
    ctx: &'a Context,
    desired: &DesiredSandbox,
    plan: &Plan,
    adopts: bool,
) -> Reserved<'a> {
    let reserved = Reserved::none(&ctx.pool);
    if !pools_on(ctx) {
        return reserved;
    }
    let learned = ctx.config.warm_pool_demand;
    let fits = same_isolation(ctx, desired);
    let at_most = pool::claims_at_most(ctx.runtime.rejoins(), adopts);
    for p in plan.provisions() {
        if reserved.entries.lock().unwrap().len() >= at_most {
            break;
        }
        let Some(kind) = pool::claim_kind(p.reason, desired.own_data(), p.retire.is_some(), fits)
        else {
            continue;
        };
        let key = PoolKey {
            engine: p.engine,
            features: p.features.clone(),
            seed: p.seed.clone(),
        };
        if learned.is_on() {
            ctx.pool.ask(&key, ctx.clock.now(), learned.window);
        } else if !ctx.config.warm_pool.contains_key(&key) {
            continue;
        }
        match ctx.pool.take(&key) {
            Some(ready) => {
                reserved
                    .entries
                    .lock()
                    .unwrap()
                    .insert(p.engine, (key, ready));
            }
            None => ctx.metrics.pool.claim(p.engine, kind, None),
        }
        ctx.pool.wake.notify_one();
    }
    ctx.pool.report(ctx);
    reserved
}

/// Serves `p` from the pool container `reserved` holds for its engine, if
/// any, on the sandbox's `network`; `None` sends it down the cold path
/// (nothing of the sandbox was changed, and a container a failed claim
/// changed is removed).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn claim(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    credentials: &Credentials,
    image: &str,
    network: &str,
    reserved: &Reserved<'_>,
) -> Option<(ContainerId, ServiceStatus)> {
    let kind = pool::claim_kind(
        p.reason,
        desired.own_data(),
        p.retire.is_some(),
        same_isolation(ctx, desired),
    )?;
    let (_, ready) = reserved.take(p.engine)?;
    let started = Instant::now();
    match take_over(ctx, desired, engine, p, &ready, credentials, image, network).await {
        Ok(claimed) => {
            let took = started.elapsed();
            ctx.metrics.pool.claim(p.engine, kind, Some(took));
            tracing::info!(
                container = %claimed.0,
                kind = kind.as_str(),
                elapsed_ms = took.as_millis() as u64,
                adopted_network = ready.network == network,
                "served from the warm pool"
            );
            Some(claimed)
        }
        Err(e) => {
            ctx.metrics.pool.claim(p.engine, kind, None);
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

/// Records the claim, then sets the credentials (over the engine's own
/// protocol), renames the container, puts it on the sandbox's `network`
/// unless it is there (adopted), and probes it with the new credentials.
#[allow(clippy::too_many_arguments)]
async fn take_over(
    ctx: &Context,
    desired: &DesiredSandbox,
    engine: &'static dyn Engine,
    p: &Provision,
    ready: &Ready,
    credentials: &Credentials,
    image: &str,
    network: &str,
) -> Result<(ContainerId, ServiceStatus), PoolError> {
    let runtime = ctx.runtime.as_ref();
    let id = &ready.id;
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
        seed: p.seed.clone(),
    };
    let labels = claim
        .labels(
            &ctx.config.deployment,
            ctx.state.get().map(ToString::to_string),
            ctx.config.isolation,
        )
        .to_map();
    // Before the container changes: a crash from here on leaves a container
    // that maps to its sandbox with an instance never published.
    ctx.store.record_claim(&claim, ctx.term()?).await?;
    ctx.pool.remember_claim(claim);

    let placement: Placement = network::placement(&ctx.config, &desired.id, p.engine, network);
    let address = probe_address(ctx, engine, id, &ready.name, ready.host_port).await?;
    let set_credentials = async {
        claim_credentials(
            ctx,
            engine,
            id,
            address,
            &ready.credentials,
            credentials,
            CLAIM_DEADLINE,
        )
        .await
        .map_err(|source| PoolError::Credentials {
            container: id.to_string(),
            source,
        })
    };
    let rename = async {
        // A heal after `docker rm -f` meets the name still held by the
        // container being removed: wait for it (see `name_release`).
        super::name_release::once_released(runtime, super::name_release::RELEASE_WITHIN, || {
            runtime.claim_as(id, &placement.container, &labels)
        })
        .await?;
        Ok::<(), PoolError>(())
    };
    let joins = placement.network != ready.network;
    let join = async {
        if joins {
            runtime
                .rejoin(&placement.network, id, &placement.aliases)
                .await?;
        }
        Ok::<(), PoolError>(())
    };
    if ctx.config.probe_via == ProbeVia::Host && !joins {
        // The credentials (over the published port) and the container's
        // name are independent: changed at once (both done before anything
        // is published).
        tokio::try_join!(set_credentials, rename, join)?;
    } else {
        // Reached by its name, which must not change meanwhile, or over a
        // published port that joining a network binds anew (cutting the
        // connection): the credentials first.
        set_credentials.await?;
        tokio::try_join!(rename, join)?;
    }
    // A container that joins a network has its ports bound again.
    let host_port = if joins {
        runtime.published_port(id).await?.unwrap_or(0)
    } else {
        ready.host_port
    };
    let (host_port, available) = bring_up_at(
        ctx,
        engine,
        id,
        &placement.container,
        host_port,
        credentials,
        &p.features,
        image,
    )
    .await
    .map_err(Box::new)?;
    let mut status = ready_status(
        ctx,
        engine,
        p,
        placement.host,
        host_port,
        credentials.clone(),
        available,
        instance,
        image,
    );
    status.node = super::provision::node_of(ctx, id).await;
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
/// planner sees it, and every pool container. The pool's memory is
/// brought in line with what is listed.
pub(crate) async fn relisted(ctx: &Context) -> Result<Relisted, ControllerError> {
    if !pools_on(ctx) && ctx.pool.claims.lock().unwrap().is_empty() {
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
    let claims: Vec<PoolClaim> = ctx.pool.claims.lock().unwrap().values().cloned().collect();
    Ok(Relisted {
        claimed: match_claims(ctx, claims, &listed).await,
        listed,
    })
}

/// Removes the pool networks (of the deployment's `networks`) whose
/// container is gone (claimed or not), that no sandbox's status names as
/// its network (`adopted`), and that nothing is connected to any more.
/// One that cannot be removed now is left for the next relist.
pub(crate) async fn remove_orphan_networks(
    ctx: &Context,
    listed: &[PooledContainer],
    networks: &[ObservedResource],
    adopted: &HashSet<&str>,
) -> Result<(), RuntimeError> {
    if !matches!(ctx.config.network, NetworkLayout::PerSandbox { .. }) {
        return Ok(());
    }
    let prefix = pool_network_prefix(&ctx.config.deployment);
    for n in networks {
        let Some(token) = n.name.strip_prefix(&prefix) else {
            continue;
        };
        let in_use = listed
            .iter()
            .any(|c| c.instance.eq_ignore_ascii_case(token))
            || adopted.contains(n.name.as_str())
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
    /// Every pool container (claimed or not).
    pub(crate) listed: Vec<PooledContainer>,
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
/// while a sandbox waits for a worker. The containers being started are
/// this loop's: aborting it when leadership ends aborts them too, rather
/// than leaving them to be refused by the fence (what they leave behind
/// the next leader removes, see [`start_term`]).
pub(crate) async fn refill_loop(ctx: Arc<Context>, queue: WorkQueue<crate::domain::id::SandboxId>) {
    if !pools_on(&ctx) {
        return;
    }
    let mut fills = tokio::task::JoinSet::new();
    loop {
        // Finished fills report themselves; only their slots are freed here.
        while fills.try_join_next().is_some() {}
        let busy = queue.due() > 0;
        let targets = ctx.pool.targets(&ctx);
        shrink(&ctx, &targets).await;
        let now = ctx.clock.now();
        for (key, size) in &targets {
            let n = {
                let mut st = ctx.pool.state.lock().unwrap();
                if Pool::backing_off(&st, key, now, &ctx.config.crash_loop) {
                    continue;
                }
                let ready = st.ready.get(key).map_or(0, Vec::len);
                let creating = st.creating.get(key).copied().unwrap_or(0);
                let n = pool::to_start(*size, ready, creating, AT_ONCE, busy);
                *st.creating.entry(key.clone()).or_default() += n;
                n
            };
            for _ in 0..n {
                let ctx = ctx.clone();
                let key = key.clone();
                fills.spawn(async move {
                    let result = fill_one(&ctx, &key).await;
                    let stopped = ctx.pool.started(
                        &key,
                        result.as_ref().err(),
                        ctx.clock.now(),
                        &ctx.config.crash_loop,
                    );
                    ctx.metrics.pool.start(key.engine, result.is_ok());
                    if let (Err(_), Some(hash)) = (&result, &key.seed) {
                        // Read again next time: a deleted seed is then
                        // unknown, not a read that fails.
                        ctx.seeds.forget(hash);
                    }
                    let mut st = ctx.pool.state.lock().unwrap();
                    if let Some(c) = st.creating.get_mut(&key) {
                        *c = c.saturating_sub(1);
                    }
                    match result {
                        Ok(ready) => st.ready.entry(key.clone()).or_default().push(ready),
                        Err(e) if stopped => {
                            tracing::warn!(pool = %key, error = %e, "a warm-pool container's seed failed; the seed's pool stops until a request names the seed again (and then starts after a back-off)")
                        }
                        Err(e) => {
                            tracing::warn!(pool = %key, error = %e, failures = st.failed.get(&key).map_or(0, Vec::len), "could not start a warm-pool container; trying again after a back-off")
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
            biased;
            () = ctx.pool.wake.notified() => {}
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        // A failing refill must not spin.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether any pool is kept: configured, or learned from demand.
fn pools_on(ctx: &Context) -> bool {
    !ctx.config.warm_pool.is_empty() || ctx.config.warm_pool_demand.is_on()
}

/// Removes the ready containers of pools above their size now (a learned
/// pool whose feature set nobody asked for within the window has size 0):
/// they hold memory the pools that are asked for need. Their networks go
/// at the next relist ([`remove_orphan_networks`]).
async fn shrink(ctx: &Context, targets: &BTreeMap<PoolKey, usize>) {
    let surplus: Vec<(PoolKey, Ready)> = {
        let mut st = ctx.pool.state.lock().unwrap();
        let mut surplus = Vec::new();
        for (key, ready) in st.ready.iter_mut() {
            let keep = targets.get(key).copied().unwrap_or(0);
            while ready.len() > keep {
                if let Some(r) = ready.pop() {
                    surplus.push((key.clone(), r));
                }
            }
        }
        st.ready.retain(|_, ready| !ready.is_empty());
        surplus
    };
    for (key, r) in surplus {
        match ctx.runtime.remove(&r.id, Duration::ZERO).await {
            Ok(()) => {
                tracing::info!(pool = %key, container = %r.id, "removed a warm-pool container no recent request needs")
            }
            Err(e) => {
                tracing::warn!(pool = %key, container = %r.id, error = %e, "could not remove a surplus warm-pool container; the next term removes it")
            }
        }
    }
    if !targets.is_empty() {
        ctx.pool.report(ctx);
    }
}

/// A pool network marked as being created (not an orphan) until dropped,
/// also when the fill creating it is aborted.
struct CreatingNetwork<'a> {
    pool: &'a Pool,
    network: &'a str,
}

impl<'a> CreatingNetwork<'a> {
    fn mark(pool: &'a Pool, network: &'a str) -> Self {
        pool.creating_networks
            .lock()
            .unwrap()
            .insert(network.to_owned());
        CreatingNetwork { pool, network }
    }
}

impl Drop for CreatingNetwork<'_> {
    fn drop(&mut self) {
        self.pool
            .creating_networks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(self.network);
    }
}

/// Creates, starts and probes one pool container of `key`.
async fn fill_one(ctx: &Context, key: &PoolKey) -> Result<Ready, PoolError> {
    let engine = ctx
        .engines
        .get(key.engine)
        .ok_or(ProvisionError::UnknownEngine(key.engine))
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
    // On its own network under the engine's name already: the sandbox
    // that claims it first adopts that network.
    let aliases = match ctx.config.network {
        NetworkLayout::PerSandbox { .. } => vec![key.engine.as_str().to_owned()],
        NetworkLayout::Shared { .. } => Vec::new(),
    };
    let placement = Placement {
        container: name.clone(),
        network: network_name(ctx, &token.to_ascii_lowercase()),
        host: name.clone(),
        aliases,
    };
    // A data-file seed is in the container from its start, as is any
    // other once its seed's template is made; until then it is loaded
    // once the engine is ready, and this container's copy makes that
    // template before it is offered.
    let seeded = key.seed.as_ref().map(|hash| seed_template::Kind {
        engine,
        image: &image,
        features: &key.features,
        hash,
    });
    let data_file = match &seeded {
        Some(kind) => super::seed::data_file(ctx, engine, &image, kind.hash)
            .await
            .map_err(|e| PoolError::Provision(Box::new(e.into())))?,
        None => None,
    };
    let seed_copy = match (&seeded, &data_file) {
        (Some(kind), None) => seed_template::ready(ctx, kind).await,
        _ => None,
    };
    // A seed's template this container does not start from is forgotten
    // (the next one loads the seed and copies it anew).
    let forget_copy = |ctx: &Context| {
        if let Some(copy) = &seed_copy {
            seed_template::forget(ctx, copy);
        }
    };
    let seed_file = data_file.or(seed_copy.clone());
    let seed_later = key.seed.as_ref().filter(|_| seed_file.is_none());
    let creating = CreatingNetwork::mark(&ctx.pool, &placement.network);
    let started = start_one(
        ctx,
        engine,
        key,
        &image,
        &credentials,
        token,
        &placement,
        seed_file,
    )
    .await;
    // Probed by name on its network (`--probe-via network`): sandboxd's own
    // container joins it, as it joins a sandbox's.
    let started = match (started, &ctx.config.controller_container) {
        (Ok(id), Some(me)) if matches!(ctx.config.network, NetworkLayout::PerSandbox { .. }) => {
            match ctx.runtime.connect(&placement.network, me).await {
                Ok(()) => Ok(id),
                Err(e) => {
                    let _ = ctx.runtime.remove(&id, Duration::ZERO).await;
                    Err(e.into())
                }
            }
        }
        (started, _) => started,
    };
    drop(creating);
    let id = started.inspect_err(|_| forget_copy(ctx))?;
    // A seed is loaded as the pool's login, which is the claimant's role
    // (or user) with another password: the claim serves the seeded data.
    let up = bring_up(
        ctx,
        engine,
        &id,
        &name,
        &credentials,
        &key.features,
        &image,
        seed_later,
    );
    match up.await {
        Ok((host_port, _)) => {
            if let (Some(kind), Some(_)) = (&seeded, seed_later) {
                seed_template::capture(ctx, kind, &id, &credentials).await;
            }
            tracing::info!(pool = %key, container = %id, "warm-pool container ready");
            Ok(Ready {
                id,
                credentials,
                network: placement.network,
                name,
                host_port,
            })
        }
        Err(e) => {
            forget_copy(ctx);
            let _ = ctx.runtime.remove(&id, Duration::ZERO).await;
            Err(PoolError::Provision(Box::new(e)))
        }
    }
}

/// Creates the pool network of `placement` and starts a pool container of
/// `key` on it (from `seed_file`, a data-file seed's volume, if any).
#[allow(clippy::too_many_arguments)]
async fn start_one(
    ctx: &Context,
    engine: &'static dyn Engine,
    key: &PoolKey,
    image: &str,
    credentials: &Credentials,
    token: String,
    placement: &Placement,
    seed_file: Option<Volume>,
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
        // The controller's level: `container_spec` runs it under its runtime.
        (
            labels::ISOLATION.to_owned(),
            ctx.config.isolation.as_str().to_owned(),
        ),
    ]);
    if let Some(state) = ctx.state.get() {
        labels.insert(labels::STATE_ID.to_owned(), state.to_string());
    }
    if let Some(seed) = &key.seed {
        labels.insert(crate::domain::seed::SEED.to_owned(), seed.to_string());
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
    match seed_file {
        Some(volume) => super::template::start_from(&mut spec, volume),
        None => super::template::apply(ctx, engine, &key.features, &mut spec).await,
    }
    Ok(ctx.runtime.create_and_start(&spec).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(id: &str) -> Ready {
        Ready {
            id: ContainerId::new(id),
            credentials: crate::engine::lookup("redis")
                .unwrap()
                .credentials(Secret::generate()),
            network: format!("sandboxd-pool.d.{id}"),
            name: id.to_owned(),
            host_port: 1,
        }
    }

    fn key(engine: &str) -> PoolKey {
        PoolKey {
            engine: crate::engine::lookup(engine).unwrap().name(),
            features: Default::default(),
            seed: None,
        }
    }

    #[test]
    fn what_a_reconcile_reserved_and_did_not_claim_goes_back_to_the_pool() {
        let pool = Pool::default();
        {
            let reserved = Reserved::none(&pool);
            for (engine, id) in [("postgres", "p1"), ("redis", "r1")] {
                reserved
                    .entries
                    .lock()
                    .unwrap()
                    .insert(key(engine).engine, (key(engine), ready(id)));
            }
            // The first engine's network is the one a new sandbox adopts.
            assert_eq!(reserved.network().as_deref(), Some("sandboxd-pool.d.p1"));
            let (_, claimed) = reserved.take(key("postgres").engine).unwrap();
            assert_eq!(claimed.id.as_str(), "p1");
        }
        assert!(
            pool.take(&key("postgres")).is_none(),
            "the claimed one is gone"
        );
        let back = pool.take(&key("redis")).expect("the unclaimed one is back");
        assert_eq!(back.id.as_str(), "r1");
    }
}
