//! Rotation builds before it destroys. A rotation's new container is
//! created next to the running one, under a temporary name and without the
//! engine's network alias, so clients keep reaching the old one
//! ([`super::provision`]). Once the new one is ready and its features
//! verified, the switch:
//!
//! 1. **publish** its credentials in the status while the old container
//!    still runs: the commit point. Before it the old container is the
//!    live one, from it on the new one (the plan decides from the status's
//!    instance token, see [`crate::domain::plan`]);
//! 2. **remove** the old container, once the row, read again, is still
//!    the one the rotation was planned on ([`super::recheck`]);
//! 3. **rejoin** the network with the engine's alias (per-sandbox networks);
//! 4. **rename** it to the engine's container name (last: a container under
//!    that name has its alias);
//! 5. read its host port, which the rejoin bound anew; the reconcile then
//!    publishes it `ready`.
//!
//! A failure before the commit removes the new container and leaves the
//! old one as it was. A failure or a crash after it leaves the new
//! container published: the next reconcile plans
//! [`Action::Promote`](crate::domain::plan::Action::Promote) and finishes
//! steps 2 to 5.
//!
//! A persistent sandbox's data volume holds one server at a time, so there
//! the old container goes first; if the new one fails, the old credentials
//! and features are re-created on the volume and published the same way
//! ([`Commit::publish`]), so its data and credentials work again.

use super::env::Env;
use super::fleet::FleetPhases;
use super::name_release;
use super::network;
use super::recheck;
use crate::domain::id::{ContainerId, EngineName, SandboxId};
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus, ServiceStatus};
use crate::domain::status::{self, StatusUpdate};
use crate::ports::runtime::RuntimeError;
use crate::ports::store::StoreError;
use tokio::sync::Mutex;

/// Why switching to a rotation's ready new container failed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// The sandbox stopped being wanted while the new container was built.
    #[error("the new {engine} container was not published: the sandbox is no longer wanted; the old container was kept")]
    NotWanted {
        /// Engine name.
        engine: EngineName,
    },
    /// The status naming the new container could not be written.
    #[error("the new {engine} container is ready but could not be published ({source}); the next attempt keeps whichever container the status names")]
    Publish {
        /// Engine name.
        engine: EngineName,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The row was deleted or rewritten while the new container was
    /// built: the new container is published, the old one kept; the next
    /// reconcile plans from the row as it is (a deleted row's containers
    /// wait out the grace window; a rewritten one's old container is
    /// removed then).
    #[error("the new {engine} container is published, but the desired row was {changed} meanwhile: the old container was kept for the next reconcile to decide on")]
    RowChanged {
        /// Engine name.
        engine: EngineName,
        /// How the row changed.
        changed: &'static str,
    },
    /// The row could not be read again before the old container's removal.
    #[error("the new {engine} container is published, but the desired row could not be read again ({source}): the old container was kept; the next attempt finishes the switch")]
    RowUnread {
        /// Engine name.
        engine: EngineName,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Docker failed while the published new container took over.
    #[error("switching to the new, published {engine} container failed ({source}); the next attempt finishes the switch")]
    Switch {
        /// Engine name.
        engine: EngineName,
        /// Docker's error.
        #[source]
        source: RuntimeError,
    },
}

/// The status row as this reconcile last wrote it: rotations publish their
/// new containers through it one at a time, each write on top of the
/// others', so that two engines switching at once do not undo each other.
pub(crate) struct Commit {
    id: SandboxId,
    /// The network the sandbox is on.
    network: String,
    /// What was written while provisioning (`None` if the row is not
    /// wanted), then each switch on top of it.
    row: Mutex<Option<StatusUpdate>>,
    /// Whether a switch was written.
    switched: std::sync::atomic::AtomicBool,
}

impl Commit {
    /// Starts from `update`, the status written while provisioning, of
    /// sandbox `id` on `network`.
    pub(crate) fn new(id: SandboxId, network: String, update: Option<StatusUpdate>) -> Self {
        Self {
            id,
            network,
            row: Mutex::new(update),
            switched: Default::default(),
        }
    }

    /// The network the sandbox is on.
    pub(crate) fn network(&self) -> &str {
        &self.network
    }

    /// What was published for `engine` before this reconcile changed it.
    pub(crate) async fn standing(&self, engine: EngineName) -> Option<ServiceStatus> {
        let row = self.row.lock().await;
        row.as_ref()?
            .services
            .get(engine.as_str())
            .map(|s| ServiceStatus::clone(s))
    }

    /// Publishes `service` as `engine`'s (`note` says why): the commit
    /// point of its rotation.
    pub(crate) async fn publish(
        &self,
        env: &Env,
        phases: &FleetPhases,
        engine: EngineName,
        service: &ServiceStatus,
        note: &str,
    ) -> Result<(), SwitchError> {
        let mut row = self.row.lock().await;
        let Some(current) = row.as_ref() else {
            return Err(SwitchError::NotWanted { engine });
        };
        let next = status::switching(current.clone(), engine, service.clone(), note);
        let term = env.term().map_err(|_| SwitchError::Publish {
            engine,
            source: StoreError::Fenced {
                term: env.fence.term().unwrap_or(crate::domain::lease::Term(0)),
            },
        })?;
        env.store
            .write_status(&self.id, &next, term)
            .await
            .map_err(|source| SwitchError::Publish { engine, source })?;
        phases.published(&self.id, Some(next.phase), &env.metrics);
        *row = Some(next);
        self.switched
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The status the reconcile's decision builds on: the last switch
    /// written, else `previous` (what was read at the start).
    pub(crate) async fn published(&self, previous: Option<SandboxStatus>) -> Option<SandboxStatus> {
        if !self.switched.load(std::sync::atomic::Ordering::Acquire) {
            return previous;
        }
        let row = self.row.lock().await.clone()?;
        Some(SandboxStatus {
            id: self.id.clone(),
            phase: row.phase,
            observed_generation: row.observed_generation,
            message: row.message,
            services: row.services,
            network: row.network,
            updated_at: None,
            incarnation: row.incarnation,
        })
    }
}

/// Switches `engine` from the running container `old` to `new`, ready and
/// verified, whose status is `service`: publish, then
/// [`promote`]. Returns the status to publish as ready. If the sandbox is
/// no longer wanted the new container is removed and the old one kept;
/// if its row changed since `desired` was read, the old one is kept.
#[tracing::instrument(name = "switch", skip_all, fields(old = %old, new = %new))]
#[allow(clippy::too_many_arguments)]
pub(crate) async fn switch(
    env: &Env,
    phases: &FleetPhases,
    commit: &Commit,
    desired: &DesiredSandbox,
    engine: EngineName,
    new: &ContainerId,
    old: &ContainerId,
    service: ServiceStatus,
) -> Result<ServiceStatus, SwitchError> {
    let note = "the new container is ready; switching to it";
    if let Err(e) = commit.publish(env, phases, engine, &service, note).await {
        if matches!(e, SwitchError::NotWanted { .. }) {
            if let Err(cleanup) = env.runtime.remove(new, std::time::Duration::ZERO).await {
                tracing::warn!(error = %cleanup, "could not remove the unpublished new container; the next reconcile will");
            }
        }
        // A store error may hide a write that landed: the new container
        // stays, and the next reconcile keeps whichever the status names.
        return Err(e);
    }
    tracing::info!("new container published; switching to it");
    // Removing the old container rests on the read this rotation was
    // planned on: read the row again first (a release or a restore while
    // the new one was built; simulation seed 220893).
    match recheck::since(env, desired).await {
        Ok(None) => {}
        Ok(Some(changed)) => {
            return Err(SwitchError::RowChanged {
                engine,
                changed: changed.as_str(),
            })
        }
        Err(source) => return Err(SwitchError::RowUnread { engine, source }),
    }
    promote(
        env,
        &commit.id,
        &commit.network,
        engine,
        new,
        Some(old),
        service,
    )
    .await
}

/// Makes the published container `container` the engine's: removes `old`
/// (if any), gives it the engine's alias on the sandbox's `network` and
/// its container name, and returns `service` with the host port it is
/// published on now.
#[tracing::instrument(name = "promote", skip_all, fields(container = %container))]
pub(crate) async fn promote(
    env: &Env,
    id: &SandboxId,
    network: &str,
    engine: EngineName,
    container: &ContainerId,
    old: Option<&ContainerId>,
    service: ServiceStatus,
) -> Result<ServiceStatus, SwitchError> {
    let failed = |source| SwitchError::Switch { engine, source };
    let runtime = env.runtime.as_ref();
    if let Some(old) = old {
        runtime
            .remove(old, env.config.stop_timeout)
            .await
            .map_err(failed)?;
        tracing::info!(old = %old, "old container removed");
    }
    let placement = network::placement(&env.config, id, engine, network);
    if !placement.aliases.is_empty() {
        runtime
            .rejoin(&placement.network, container, &placement.aliases)
            .await
            .map_err(failed)?;
    }
    // The old container may still hold the name for a moment (removed by
    // someone else, whose `rm -f` Docker is still carrying out).
    name_release::once_released(runtime, name_release::RELEASE_WITHIN, || {
        runtime.rename(container, &placement.container)
    })
    .await
    .map_err(failed)?;
    let host_port = runtime
        .published_port(container)
        .await
        .map_err(failed)?
        .unwrap_or(service.host_port);
    tracing::info!(
        name = placement.container,
        host_port,
        "switched to the new container"
    );
    Ok(ServiceStatus {
        host_port,
        ..service
    })
}
