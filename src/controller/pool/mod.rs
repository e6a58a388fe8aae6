//! The warm pool: per engine, feature set and seed, ready containers
//! nobody has claimed yet, started with a random pool password that lives
//! only in this process's memory, each on a network of its own under its
//! engine's host name. A reconcile reserves one for each provision whose
//! engine and feature set match ([`reserve`]), and a sandbox that has no
//! network yet adopts the first one's: its claim then creates no network
//! and joins none; one that has a network is joined to it under the
//! engine's host name (and keeps its own, where it is alone: leaving a
//! network costs Docker more than joining one). The claim itself is
//! [`claim`]'s; the refill, in the background, never above a pool's size
//! and only while no request waits for a worker, is [`fill`]'s. Only the
//! leader runs the pool: every Docker call goes through the fenced
//! runtime, and a new term starts from what it lists ([`start_term`]).

pub(crate) mod claim;
mod error;
pub(crate) mod fill;

pub(crate) use self::error::PoolError;

use super::env::Env;
use super::ControllerError;
use crate::config::NetworkLayout;
use crate::domain::container::{ContainerState, ObservedContainer};
use crate::domain::crash_loop::{self, CrashLoopPolicy, HealGate};
use crate::domain::id::{ContainerId, EngineName, SandboxId};
use crate::domain::labels;
use crate::domain::network::{bridge_name, pool_network_prefix};
use crate::domain::plan::Plan;
use crate::domain::pool::{self, demand, ClaimIndex, PoolClaim, PoolKey, PooledContainer};
use crate::domain::sandbox::DesiredSandbox;
use crate::engine::Credentials;
use crate::ports::runtime::{NetworkSpec, ObservedResource, RuntimeError};
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// Failed starts remembered per pool (enough to reach the back-off's cap).
const FAILURES_KEPT: usize = 32;

/// How a pool container's start ended, as [`Pool::started`] counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filled {
    /// It is ready.
    Ready,
    /// It failed: the pool backs off.
    Failed,
    /// Its seed failed (see [`PoolError::failed_seed`]): the pool backs
    /// off, and a learned pool of that seed stops.
    SeedFailed,
}

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
    /// Claims read back or made, by container (in a fixed order: a
    /// relist deletes the claims of removed containers in it).
    claims: Mutex<BTreeMap<ContainerId, PoolClaim>>,
    /// Which sandbox each claimed container serves (for the event watcher).
    pub(crate) index: Arc<ClaimIndex>,
    /// Wakes the refill.
    wake: Notify,
    /// Pool networks whose container is being created (not orphans).
    creating_networks: Mutex<HashSet<String>>,
    /// Pool containers a failed claim could not remove and whose claim
    /// this process does not know (its recording failed, or reported
    /// failure having committed): no relist would see them as a
    /// sandbox's, so each relist tries again ([`discard`]).
    abandoned: Mutex<std::collections::BTreeSet<ContainerId>>,
}

impl Pool {
    fn take(&self, key: &PoolKey) -> Option<Ready> {
        let mut st = self.state.lock().unwrap();
        let ready = st.ready.get_mut(key)?;
        #[cfg(any(test, feature = "simulation"))]
        if crate::domain::mutation::on(crate::domain::mutation::Mutation::ServeTwice) {
            return ready.last().cloned();
        }
        ready.pop()
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
        filled: Filled,
        now: DateTime<Utc>,
        policy: &CrashLoopPolicy,
    ) -> bool {
        let mut st = self.state.lock().unwrap();
        if filled == Filled::Ready {
            st.failed.remove(key);
            return false;
        }
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
        filled == Filled::SeedFailed && st.asks.remove(key).is_some()
    }

    /// Whether `key`'s pool backs off at `now` after failed starts.
    fn backing_off(
        st: &PoolState,
        key: &PoolKey,
        now: DateTime<Utc>,
        policy: &CrashLoopPolicy,
    ) -> bool {
        #[cfg(any(test, feature = "simulation"))]
        if crate::domain::mutation::on(crate::domain::mutation::Mutation::NoPoolBackoff) {
            return false;
        }
        st.failed
            .get(key)
            .is_some_and(|times| crash_loop::gate(times, now, policy) != HealGate::Now)
    }

    /// Every pool's size now: those configured, and those learned from
    /// the requests of the window ([`demand::sizes`]).
    fn targets(&self, env: &Env) -> BTreeMap<PoolKey, usize> {
        let mut targets = env.config.warm_pool.clone();
        let learned = &env.config.warm_pool_demand;
        if learned.is_on() {
            let st = self.state.lock().unwrap();
            targets.extend(demand::sizes(
                &st.asks,
                env.clock.now(),
                learned.window,
                learned.max,
                &env.config.warm_pool,
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
    pub(crate) fn view(&self, env: &Env) -> Vec<crate::ports::PoolView> {
        let targets = self.targets(env);
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

    fn report(&self, env: &Env) {
        let st = self.state.lock().unwrap();
        let mut by_engine: BTreeMap<_, (usize, usize)> = BTreeMap::new();
        for engine in env.config.warm_pool.keys().map(|k| k.engine) {
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
            env.metrics.pool.size(engine, ready, creating);
        }
    }
}

/// The network the pool container with `token` waits on: its own, internal
/// like sandbox networks (or the shared network of the shared layout).
fn network_name(env: &Env, token: &str) -> String {
    match &env.config.network {
        NetworkLayout::PerSandbox { .. } => {
            format!("{}{token}", pool_network_prefix(&env.config.deployment))
        }
        NetworkLayout::Shared { name } => name.clone(),
    }
}

fn network_spec(env: &Env, name: &str) -> Option<NetworkSpec> {
    let NetworkLayout::PerSandbox { subnets, egress } = &env.config.network else {
        return None;
    };
    let name = name.to_owned();
    let mut labels = HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            env.config.deployment.to_string(),
        ),
        (pool::POOL.to_owned(), "1".to_owned()),
    ]);
    if let Some(state) = env.state.get() {
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
pub(crate) fn same_isolation(env: &Env, desired: &DesiredSandbox) -> bool {
    desired.isolation_under(env.config.isolation) == env.config.isolation
}

/// Reserves a ready pool container for each provision of `plan` that may
/// claim one (see [`pool::claim_kind`]) and whose engine and feature set
/// has a pool; one that finds its pool empty is counted as a miss and
/// wakes the refill. `adopts`: the sandbox has no network yet and would
/// adopt the first reserved container's. Where a running container cannot
/// join another network (a Swarm task, see [`Capabilities::rejoins`]), only
/// such a sandbox claims, and only one container: the one whose network
/// it adopts.
///
/// [`Capabilities::rejoins`]: crate::ports::runtime::Capabilities::rejoins
pub(crate) fn reserve<'a>(
    env: &Env,
    pool: &'a Pool,
    desired: &DesiredSandbox,
    plan: &Plan,
    adopts: bool,
) -> Reserved<'a> {
    let reserved = Reserved::none(pool);
    if !pools_on(env) {
        return reserved;
    }
    let learned = env.config.warm_pool_demand;
    let fits = same_isolation(env, desired);
    let at_most = pool::claims_at_most(env.runtime.capabilities().rejoins, adopts);
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
            pool.ask(&key, env.clock.now(), learned.window);
        } else if !env.config.warm_pool.contains_key(&key) {
            continue;
        }
        match pool.take(&key) {
            Some(ready) => {
                reserved
                    .entries
                    .lock()
                    .unwrap()
                    .insert(p.engine, (key, ready));
            }
            None => env.metrics.pool.claim(p.engine, kind, None),
        }
        pool.wake.notify_one();
    }
    pool.report(env);
    reserved
}

/// The claimed pool containers of `sandbox`, as the planner sees them;
/// claims whose container is gone are deleted. Read through
/// [`super::containers`].
pub(super) async fn observed_of(
    env: &Env,
    pool: &Pool,
    sandbox: &SandboxId,
) -> Result<Vec<ObservedContainer>, RuntimeError> {
    let claims = pool.claims_of(sandbox);
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let listed = env.runtime.pool_containers(&env.config.deployment).await?;
    Ok(match_claims(env, pool, claims, &listed).await)
}

/// What a relist sees of the pool: every claimed pool container as the
/// planner sees it, and every pool container. The pool's memory is
/// brought in line with what is listed. Read through
/// [`super::containers`].
pub(super) async fn relisted(env: &Env, pool: &Pool) -> Result<Relisted, RuntimeError> {
    if !pools_on(env) && pool.claims.lock().unwrap().is_empty() {
        return Ok(Relisted::default());
    }
    let abandoned = std::mem::take(&mut *pool.abandoned.lock().unwrap());
    for id in abandoned {
        discard(env, pool, &id).await;
    }
    let listed = env.runtime.pool_containers(&env.config.deployment).await?;
    {
        // A ready container that died or vanished is no longer ready.
        let mut st = pool.state.lock().unwrap();
        for entries in st.ready.values_mut() {
            entries.retain(|r| {
                listed
                    .iter()
                    .any(|l| l.id == r.id && l.state == ContainerState::Running)
            });
        }
    }
    pool.report(env);
    let claims: Vec<PoolClaim> = pool.claims.lock().unwrap().values().cloned().collect();
    Ok(Relisted {
        claimed: match_claims(env, pool, claims, &listed).await,
        listed,
    })
}

/// Removes the pool networks (of the deployment's `networks`) whose
/// container is gone (claimed or not), that no sandbox's status names as
/// its network (`adopted`), and that nothing is connected to any more.
/// One that cannot be removed now is left for the next relist.
pub(crate) async fn remove_orphan_networks(
    env: &Env,
    pool: &Pool,
    listed: &[PooledContainer],
    networks: &[ObservedResource],
    adopted: &HashSet<&str>,
) -> Result<(), RuntimeError> {
    if !matches!(env.config.network, NetworkLayout::PerSandbox { .. }) {
        return Ok(());
    }
    let prefix = pool_network_prefix(&env.config.deployment);
    for n in networks {
        let Some(token) = n.name.strip_prefix(&prefix) else {
            continue;
        };
        let in_use = listed
            .iter()
            .any(|c| c.instance.eq_ignore_ascii_case(token))
            || adopted.contains(n.name.as_str())
            || pool.creating_networks.lock().unwrap().contains(&n.name);
        if in_use {
            continue;
        }
        let members = env.runtime.network_members(&n.name).await?;
        let alone = members.is_none_or(|m| {
            m.iter()
                .all(|c| env.config.controller_container.as_deref() == Some(c.as_str()))
        });
        if !alone {
            continue;
        }
        match env
            .runtime
            .remove_network(&n.name, &env.config.deployment)
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

/// The claimed containers among `listed`; the claims of containers no
/// longer listed are deleted.
async fn match_claims(
    env: &Env,
    pool: &Pool,
    claims: Vec<PoolClaim>,
    listed: &[PooledContainer],
) -> Vec<ObservedContainer> {
    let (seen, gone) = pool::claimed(&claims, listed);
    for claim in gone {
        // Removed (torn down, replaced, or by hand): the claim goes.
        if let Ok(term) = env.term() {
            match env.store.delete_claim(&claim.container, term).await {
                Ok(()) => pool.forget_claim(&claim.container),
                Err(e) => {
                    tracing::warn!(container = %claim.container, error = %e, "could not delete the claim of a removed pool container")
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
pub(crate) async fn start_term(env: &Env, pool: &Pool) -> Result<(), ControllerError> {
    let state = env.state_id().await?.to_string();
    let claims = env.store.pool_claims().await?;
    pool.index.replace(&claims);
    *pool.claims.lock().unwrap() = claims
        .iter()
        .map(|c| (c.container.clone(), c.clone()))
        .collect();
    let listed = env.runtime.pool_containers(&env.config.deployment).await?;
    let claimed: Vec<PoolClaim> = claims.clone();
    match_claims(env, pool, claimed, &listed).await;
    let known: Vec<ContainerId> = {
        let mut st = pool.state.lock().unwrap();
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
        env.runtime.remove(&l.id, Duration::ZERO).await?;
    }
    pool.report(env);
    Ok(())
}

/// Removes the pool container `id` that a claim failed to take over, and
/// deletes its claim (recorded or not: a recording that reported failure
/// may have committed). One that cannot be removed now is left to the
/// sandbox's reconcile if this process knows its claim (the planner sees
/// it as the sandbox's), else to the next relist.
pub(crate) async fn discard(env: &Env, pool: &Pool, id: &ContainerId) {
    if let Err(e) = env.runtime.remove(id, Duration::ZERO).await {
        let known = pool.claims.lock().unwrap().contains_key(id);
        if !known {
            pool.abandoned.lock().unwrap().insert(id.clone());
        }
        tracing::warn!(container = %id, error = %e, "could not remove a pool container whose claim failed; trying again later");
        return;
    }
    if let Ok(term) = env.term() {
        if env.store.delete_claim(id, term).await.is_ok() {
            pool.forget_claim(id);
        }
    }
}

/// Whether any pool is kept: configured, or learned from demand.
fn pools_on(env: &Env) -> bool {
    !env.config.warm_pool.is_empty() || env.config.warm_pool_demand.is_on()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(id: &str) -> Ready {
        Ready {
            id: ContainerId::new(id),
            credentials: crate::engine::lookup("redis")
                .unwrap()
                .credentials(crate::domain::secret::Secret::generate()),
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
