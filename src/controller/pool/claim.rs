//! A claim: a ready pool container becomes a sandbox's. The claim is
//! recorded in the state database first (Docker labels cannot change, and
//! a crash from then on leaves a container that maps to its sandbox with
//! an instance never published); then the claimant's credentials are set
//! over the engine's own protocol while the container takes the sandbox's
//! container name and joins its network (unless it adopted the pool
//! container's); then it is probed with the new credentials. A claim that
//! fails removes the container: the next start serves the sandbox.

use super::{Pool, PoolError, Ready, Reserved};
use crate::config::ProbeVia;
use crate::controller::bring_up::{bring_up_at, claim_credentials};
use crate::controller::env::Env;
use crate::controller::name_release;
use crate::controller::network::{self, Placement};
use crate::controller::reach::probe_address;
use crate::domain::id::ContainerId;
use crate::domain::plan::Provision;
use crate::domain::pool::{ClaimKind, PoolClaim};
use crate::domain::sandbox::DesiredSandbox;
use crate::engine::{Credentials, Engine};
use std::time::Duration;
use tokio::time::Instant;

/// How long setting a claimant's credentials may take.
const CLAIM_DEADLINE: Duration = Duration::from_secs(10);

/// Who claims a pool container, and with what.
pub(crate) struct Claimant<'a> {
    /// The row.
    pub(crate) desired: &'a DesiredSandbox,
    /// The engine.
    pub(crate) engine: &'static dyn Engine,
    /// The planned provision (features, seed).
    pub(crate) provision: &'a Provision,
    /// The sandbox's credentials, set in the container.
    pub(crate) credentials: &'a Credentials,
    /// The new credential-set token the claim records.
    pub(crate) instance: &'a str,
    /// The image, for the feature check.
    pub(crate) image: &'a str,
    /// The sandbox's network.
    pub(crate) network: &'a str,
    /// A create's claim or a heal's.
    pub(crate) kind: ClaimKind,
}

/// A claimed container, ready under the sandbox's credentials.
#[derive(Debug)]
pub(crate) struct Claimed {
    /// The container.
    pub(crate) id: ContainerId,
    /// The host port its engine port is published on now.
    pub(crate) host_port: u16,
    /// The features it has.
    pub(crate) available: Vec<String>,
}

/// What a claim came to.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The container is the sandbox's, ready under its credentials.
    Claimed(Claimed),
    /// No pool container was reserved for the engine.
    NoneReserved,
    /// The claim failed and its container is being removed; the removal
    /// can fail, and what the claim asked of Docker can land after it
    /// gave up, so the container may stay behind named and labelled as
    /// the sandbox's, under the claim's token.
    Failed,
}

/// Serves the claimant from the pool container `reserved` holds for its
/// engine, if any; anything but [`Claim::Claimed`] sends it to its next
/// start.
pub(crate) async fn claim(
    env: &Env,
    pool: &Pool,
    who: &Claimant<'_>,
    reserved: &Reserved<'_>,
) -> Claim {
    let engine = who.provision.engine;
    let Some((_, ready)) = reserved.take(engine) else {
        return Claim::NoneReserved;
    };
    let started = Instant::now();
    match take_over(env, pool, who, &ready).await {
        Ok(claimed) => {
            let took = started.elapsed();
            env.metrics.pool.claim(engine, who.kind, Some(took));
            tracing::info!(
                container = %claimed.id,
                kind = who.kind.as_str(),
                elapsed_ms = took.as_millis() as u64,
                adopted_network = ready.network == who.network,
                "served from the warm pool"
            );
            Claim::Claimed(claimed)
        }
        Err(e) => {
            env.metrics.pool.claim(engine, who.kind, None);
            tracing::warn!(container = %ready.id, error = %e, "warm-pool claim failed; removing the container and starting the sandbox's otherwise");
            super::discard(env, pool, &ready.id).await;
            Claim::Failed
        }
    }
}

/// Records the claim, moves the container into the sandbox ([`adopt`])
/// and probes it with the new credentials.
async fn take_over(
    env: &Env,
    pool: &Pool,
    who: &Claimant<'_>,
    ready: &Ready,
) -> Result<Claimed, PoolError> {
    let p = who.provision;
    let claim = PoolClaim {
        container: ready.id.clone(),
        sandbox: who.desired.id.clone(),
        engine: p.engine.as_str().to_owned(),
        generation: who.desired.generation,
        incarnation: who.desired.incarnation.as_ref().map(ToString::to_string),
        owner: who.desired.owner.clone(),
        features: p.features.clone(),
        instance: who.instance.to_owned(),
        seed: p.seed.clone(),
    };
    env.store.record_claim(&claim, env.term()?).await?;
    pool.remember_claim(claim.clone());
    let placement = network::placement(&env.config, &who.desired.id, p.engine, who.network);
    let host_port = adopt(env, who, ready, &claim, &placement).await?;
    let (host_port, available) = bring_up_at(
        env,
        who.engine,
        &ready.id,
        &placement.container,
        host_port,
        who.credentials,
        &p.features,
        who.image,
    )
    .await
    .map_err(Box::new)?;
    Ok(Claimed {
        id: ready.id.clone(),
        host_port,
        available,
    })
}

/// Sets the claimant's credentials in the container, gives it the
/// sandbox's container name and labels and puts it on the sandbox's
/// network unless it is there (adopted): the host port its engine port
/// is published on afterwards.
async fn adopt(
    env: &Env,
    who: &Claimant<'_>,
    ready: &Ready,
    claim: &PoolClaim,
    placement: &Placement,
) -> Result<u16, PoolError> {
    let id = &ready.id;
    let address = probe_address(env, who.engine, id, &ready.name, ready.host_port).await?;
    let set_credentials = async {
        let (old, new) = (&ready.credentials, who.credentials);
        claim_credentials(env, who.engine, id, address, old, new, CLAIM_DEADLINE)
            .await
            .map_err(|source| PoolError::Credentials {
                container: id.to_string(),
                source,
            })
    };
    let joins = placement.network != ready.network;
    let move_in = async {
        let join = async {
            if joins {
                let (network, aliases) = (&placement.network, &placement.aliases);
                env.runtime.rejoin(network, id, aliases).await?;
            }
            Ok::<(), PoolError>(())
        };
        tokio::try_join!(rename(env, id, claim, &placement.container), join).map(|_| ())
    };
    if env.config.probe_via == ProbeVia::Host && !joins {
        // The credentials (over the published port) and the container's
        // name are independent: changed at once (both done before anything
        // is published).
        tokio::try_join!(set_credentials, move_in)?;
    } else {
        // Reached by its name, which must not change meanwhile, or over a
        // published port that joining a network binds anew (cutting the
        // connection): the credentials first.
        set_credentials.await?;
        move_in.await?;
    }
    // A container that joins a network has its ports bound again.
    Ok(if joins {
        env.runtime.published_port(id).await?.unwrap_or(0)
    } else {
        ready.host_port
    })
}

/// Gives the claimed container `id` the sandbox's container `name` and
/// the labels it would carry had it been created for the claim.
async fn rename(
    env: &Env,
    id: &ContainerId,
    claim: &PoolClaim,
    name: &str,
) -> Result<(), PoolError> {
    let state = env.state.get().map(ToString::to_string);
    let labels = claim.labels(&env.config.deployment, state, env.config.isolation);
    let labels = labels.to_map();
    let runtime = env.runtime.as_ref();
    // A heal after `docker rm -f` meets the name still held by the
    // container being removed: wait for it (see `name_release`).
    name_release::once_released(runtime, name_release::RELEASE_WITHIN, || {
        runtime.claim_as(id, name, &labels)
    })
    .await?;
    Ok(())
}
