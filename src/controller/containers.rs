//! The containers of a sandbox, however each one started. A container
//! created for the sandbox (cold, from a template, a seed or a fork's
//! copy, a rotation's) carries the sandbox's labels; a warm-pool container
//! it claimed carries the pool's (Docker labels cannot change) and its
//! claim, in the state database and the pool's memory, says whose it is
//! ([`crate::domain::pool::claimed`]). Every part of the controller that
//! looks for a sandbox's containers (its reconcile, a fork copying it, a
//! relist) finds them here, so none of them misses a claimed one.

use super::env::Env;
use super::pool::{self, Pool};
use crate::domain::container::ObservedContainer;
use crate::domain::id::SandboxId;
use crate::domain::pool::PooledContainer;
use crate::ports::runtime::RuntimeError;

/// Every container of the sandbox `id`: those labelled with it and the
/// warm-pool containers claimed for it.
pub(crate) async fn of_sandbox(
    env: &Env,
    pool: &Pool,
    id: &SandboxId,
) -> Result<Vec<ObservedContainer>, RuntimeError> {
    let mut observed = env.runtime.list(&env.config.deployment, Some(id)).await?;
    observed.extend(pool::observed_of(env, pool, id).await?);
    Ok(observed)
}

/// Every sandbox container of the deployment (claimed warm-pool
/// containers included), and every pool container, claimed or not (the
/// pool's memory is brought in line with them).
pub(crate) async fn of_every_sandbox(
    env: &Env,
    pool: &Pool,
) -> Result<(Vec<ObservedContainer>, Vec<PooledContainer>), RuntimeError> {
    let mut observed = env.runtime.list(&env.config.deployment, None).await?;
    let pooled = pool::relisted(env, pool).await?;
    observed.extend(pooled.claimed);
    Ok((observed, pooled.listed))
}
