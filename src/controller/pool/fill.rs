//! The refill: every pool kept at its size while this process leads.
//! A pool container is started like any sandbox's ([`start`]): from its
//! seed's file or template, the engine's template, or cold, on a network
//! of its own under its engine's host name, with a random pool password
//! only this process knows.

use super::{network_name, network_spec, pools_on, Filled, Pool, PoolError, Ready};
use crate::config::NetworkLayout;
use crate::controller::bring_up::{container_spec, new_instance, ProvisionError};
use crate::controller::env::Env;
use crate::controller::network::Placement;
use crate::controller::start::{self, Job, Owner, Sources};
use crate::controller::Context;
use crate::domain::labels;
use crate::domain::pool::{self, PoolKey};
use crate::domain::secret::Secret;
use crate::domain::start::Wanted;
use crate::engine::{Credentials, Engine};
use crate::ports::runtime::ContainerSpec;
use crate::sched::WorkQueue;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Pool containers started at once per pool.
const AT_ONCE: usize = 1;
/// How often the refill looks without being woken.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Keeps every configured pool at its size while this process leads:
/// starts at most [`AT_ONCE`] container per pool at a time, and none
/// while a sandbox waits for a worker. The containers being started are
/// this loop's: aborting it when leadership ends aborts them too, rather
/// than leaving them to be refused by the fence (what they leave behind
/// the next leader removes, see [`super::start_term`]).
pub(crate) async fn refill_loop(ctx: Arc<Context>, queue: WorkQueue<crate::domain::id::SandboxId>) {
    let (env, sources) = (&ctx.env, &ctx.sources);
    if !pools_on(env) {
        return;
    }
    let mut fills = tokio::task::JoinSet::new();
    loop {
        // Finished fills report themselves; only their slots are freed here.
        while fills.try_join_next().is_some() {}
        let busy = queue.due() > 0;
        let targets = sources.pool.targets(env);
        shrink(env, sources, &targets).await;
        let now = env.clock.now();
        for (key, size) in &targets {
            let n = {
                let mut st = sources.pool.state.lock().unwrap();
                if Pool::backing_off(&st, key, now, &env.config.crash_loop) {
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
                fills.spawn(async move { fill_and_record(&ctx.env, &ctx.sources, &key).await });
            }
        }
        sources.pool.report(env);
        tokio::select! {
            biased;
            () = sources.pool.wake.notified() => {}
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        // A failing refill must not spin.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes the ready containers of pools above their size now (a learned
/// pool whose feature set nobody asked for within the window has size 0):
/// they hold memory the pools that are asked for need. Their networks go
/// at the next relist ([`super::remove_orphan_networks`]).
async fn shrink(env: &Env, sources: &Sources, targets: &BTreeMap<PoolKey, usize>) {
    let surplus: Vec<(PoolKey, Ready)> = {
        let mut st = sources.pool.state.lock().unwrap();
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
        match env.runtime.remove(&r.id, Duration::ZERO).await {
            Ok(()) => {
                tracing::info!(pool = %key, container = %r.id, "removed a warm-pool container no recent request needs")
            }
            Err(e) => {
                tracing::warn!(pool = %key, container = %r.id, error = %e, "could not remove a surplus warm-pool container; the next term removes it")
            }
        }
    }
    if !targets.is_empty() {
        sources.pool.report(env);
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

/// Starts one container of `key`'s pool and records how it went: ready,
/// or a failure the pool backs off after (a failing seed stops its pool).
async fn fill_and_record(env: &Env, sources: &Sources, key: &PoolKey) {
    let result = fill_one(env, sources, key).await;
    let filled = match &result {
        Ok(_) => Filled::Ready,
        Err(e) if e.failed_seed().is_some() => Filled::SeedFailed,
        Err(_) => Filled::Failed,
    };
    let stopped = sources
        .pool
        .started(key, filled, env.clock.now(), &env.config.crash_loop);
    env.metrics.pool.start(key.engine, result.is_ok());
    if let (Err(_), Some(hash)) = (&result, &key.seed) {
        // Read again next time: a deleted seed is then
        // unknown, not a read that fails.
        sources.seeds.forget(hash);
    }
    let mut st = sources.pool.state.lock().unwrap();
    if let Some(c) = st.creating.get_mut(key) {
        *c = c.saturating_sub(1);
    }
    match result {
        Ok(ready) => st.ready.entry(key.clone()).or_default().push(ready),
        Err(e) if stopped => {
            tracing::warn!(pool = %key, error = %e, "a warm-pool container's seed failed; the seed's pool stops until a request names the seed again (and then starts after a back-off)")
        }
        Err(e) => {
            tracing::warn!(pool = %key, error = %e, failures = st.failed.get(key).map_or(0, Vec::len), "could not start a warm-pool container; trying again after a back-off")
        }
    }
    drop(st);
    sources.pool.report(env);
    sources.pool.wake.notify_one();
}

/// Creates, starts and probes one pool container of `key`, on a pool
/// network of its own (marked as being created meanwhile, so no relist
/// takes it for an orphan).
async fn fill_one(env: &Env, sources: &Sources, key: &PoolKey) -> Result<Ready, PoolError> {
    let engine = env
        .engines
        .get(key.engine)
        .ok_or(ProvisionError::UnknownEngine(key.engine))
        .map_err(Box::new)?;
    let image = env
        .config
        .images
        .image_for(engine, !key.features.is_empty());
    let credentials = engine.credentials(Secret::generate());
    let token = new_instance();
    let placement = placement(env, key, &token.to_ascii_lowercase());
    let creating = CreatingNetwork::mark(&sources.pool, &placement.network);
    let up = async {
        prepare_network(env, &placement.network).await?;
        let job = Job {
            engine,
            spec: spec(env, engine, key, &image, &credentials, token, &placement),
            credentials: &credentials,
            features: &key.features,
            seed: key.seed.as_ref(),
            owner: Owner::Pool,
        };
        let wanted = Wanted {
            claim: None,
            fork: false,
            seeded: key.seed.is_some(),
            persistent: false,
        };
        let starts = crate::domain::start::starts(wanted);
        start::run(env, sources, &job, &starts)
            .await
            .map_err(|e| PoolError::Provision(Box::new(e)))
    }
    .await;
    drop(creating);
    let up = up?;
    tracing::info!(pool = %key, container = %up.id, "warm-pool container ready");
    Ok(Ready {
        id: up.id,
        credentials,
        network: placement.network,
        name: placement.container,
        host_port: up.host_port,
    })
}

/// Where a pool container of `key` with `token` waits: on its own network
/// under the engine's name already (the sandbox that claims it first
/// adopts that network).
fn placement(env: &Env, key: &PoolKey, token: &str) -> Placement {
    let name = format!(
        "sandboxd-pool.{}.{}.{token}",
        env.config.deployment, key.engine
    );
    let aliases = match env.config.network {
        NetworkLayout::PerSandbox { .. } => vec![key.engine.as_str().to_owned()],
        NetworkLayout::Shared { .. } => Vec::new(),
    };
    Placement {
        container: name.clone(),
        network: network_name(env, token),
        host: name,
        aliases,
    }
}

/// Creates the pool network `name` and, where sandboxd probes engines by
/// name (`--probe-via network`), puts its own container on it, as on a
/// sandbox's.
async fn prepare_network(env: &Env, name: &str) -> Result<(), PoolError> {
    if let Some(spec) = network_spec(env, name) {
        env.runtime.ensure_network(&spec).await?;
    }
    if let (Some(me), NetworkLayout::PerSandbox { .. }) =
        (&env.config.controller_container, &env.config.network)
    {
        env.runtime.connect(name, me).await?;
    }
    Ok(())
}

/// The container of a pool of `key`: labelled as the pool's (no sandbox),
/// started with the pool's login.
fn spec(
    env: &Env,
    engine: &'static dyn Engine,
    key: &PoolKey,
    image: &str,
    credentials: &Credentials,
    token: String,
    placement: &Placement,
) -> ContainerSpec {
    let features: Vec<&str> = key.features.iter().map(String::as_str).collect();
    let mut labels = HashMap::from([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (
            labels::DEPLOYMENT.to_owned(),
            env.config.deployment.to_string(),
        ),
        (labels::ENGINE.to_owned(), key.engine.as_str().to_owned()),
        (labels::FEATURES.to_owned(), features.join(",")),
        (labels::INSTANCE.to_owned(), token),
        (pool::POOL.to_owned(), "1".to_owned()),
        // The controller's level: `container_spec` runs it under its runtime.
        (
            labels::ISOLATION.to_owned(),
            env.config.isolation.as_str().to_owned(),
        ),
    ]);
    if let Some(state) = env.state.get() {
        labels.insert(labels::STATE_ID.to_owned(), state.to_string());
    }
    if let Some(seed) = &key.seed {
        labels.insert(crate::domain::seed::SEED.to_owned(), seed.to_string());
    }
    if let Some(term) = env.fence.term() {
        labels.insert(crate::domain::lease::TERM_LABEL.into(), term.to_string());
    }
    let mut spec = container_spec(
        &env.config,
        engine,
        placement,
        image,
        credentials,
        &key.features,
        labels,
        None,
    );
    spec.cmd.extend(engine.pool_args(credentials));
    spec
}
