//! Why a pool container could not be had or claimed.

use crate::controller::bring_up::ProvisionError;
use crate::domain::seed::SeedHash;
use crate::ports::runtime::RuntimeError;

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
    Fenced(#[from] crate::controller::Fenced),
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
    /// stops (see `Pool::started`); anything else only backs off.
    pub(super) fn failed_seed(&self) -> Option<&SeedHash> {
        use crate::controller::seed::SeedError as S;
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
