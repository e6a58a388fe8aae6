//! The Rust API for orchestrators: write the desired row, wait for the
//! sandbox to be ready, release it. Other languages use the same contract
//! in plain SQL (see README).

use crate::adapters::postgres::{self, PgStore, STATUS_CHANNEL};
use crate::domain::id::SandboxId;
use crate::domain::sandbox::{Phase, SandboxStatus};
use crate::ports::store::{Store, StoreError};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Failures of the orchestrator client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The database failed or rejected the row.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sandbox failed to provision.
    #[error("sandbox {id} failed: {message}")]
    Failed {
        /// Sandbox id.
        id: SandboxId,
        /// The controller's message.
        message: String,
    },
    /// The sandbox did not become ready in time.
    #[error("sandbox {id} was not ready within {timeout:?} (last phase: {phase}); is sandboxd running? see `sandboxd get {id}`")]
    Timeout {
        /// Sandbox id.
        id: SandboxId,
        /// How long the client waited.
        timeout: Duration,
        /// The last phase seen.
        phase: String,
    },
}

/// What an orchestrator asks for.
#[derive(Debug, Clone, Default)]
pub struct SandboxRequest {
    /// Who asks; empty means the database role the client connects as
    /// (what an own-rows-only orchestrator must write).
    pub owner: String,
    /// Engines: postgres, redis, valkey, mongo.
    pub services: Vec<String>,
    /// Features per engine.
    pub features: BTreeMap<String, BTreeSet<String>>,
    /// Names of Docker containers (the agents) sandboxd connects to the
    /// sandbox's network: at most 16, each once.
    pub attach: Vec<String>,
    /// When it stops being wanted.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What a status says to a client waiting for `generation`: ready (the
/// status), failed (an error), or not yet (`None`).
fn settled(status: &SandboxStatus, generation: i64) -> Option<Result<SandboxStatus, ClientError>> {
    if status.observed_generation < generation {
        return None;
    }
    match status.phase {
        Phase::Ready => Some(Ok(status.clone())),
        Phase::Failed => Some(Err(ClientError::Failed {
            id: status.id.clone(),
            message: status.message.clone(),
        })),
        Phase::Pending | Phase::Provisioning | Phase::Terminating => None,
    }
}

/// A handle on the state database for orchestrators.
#[derive(Debug, Clone)]
pub struct Client {
    store: PgStore,
}

impl Client {
    /// Connects to the state database.
    pub async fn connect(database_url: &str) -> Result<Self, ClientError> {
        Ok(Self {
            store: PgStore::connect(database_url, 4).await?,
        })
    }

    /// Uses an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            store: PgStore::from_pool(pool),
        }
    }

    /// Writes (inserts or replaces) the desired row; returns its generation.
    pub async fn apply(&self, id: &SandboxId, req: &SandboxRequest) -> Result<i64, ClientError> {
        Ok(self
            .store
            .upsert_desired(
                id,
                &req.owner,
                &req.services,
                &req.features,
                &req.attach,
                req.expires_at,
            )
            .await?)
    }

    /// Waits until the status reflects `generation` and is ready (returned)
    /// or failed (an error), or `timeout` passes.
    pub async fn wait_ready(
        &self,
        id: &SandboxId,
        generation: i64,
        timeout: Duration,
    ) -> Result<SandboxStatus, ClientError> {
        // The listener has its own connection, outside the pool: waiters
        // must not starve the pool they read their status with.
        let mut listener = postgres::listen(self.store.pool(), &[STATUS_CHANNEL]).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_phase = "none".to_owned();
        loop {
            // Check after subscribing, and after every wake-up or tick: a
            // NOTIFY lost to a reconnect costs at most one tick.
            if let Some(s) = self.store.fetch_status(id).await? {
                last_phase = s.phase.to_string();
                if let Some(outcome) = settled(&s, generation) {
                    return outcome;
                }
            }
            let wait = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_secs(1));
            if wait.is_zero() {
                return Err(ClientError::Timeout {
                    id: id.clone(),
                    timeout,
                    phase: last_phase,
                });
            }
            // A change of this sandbox's status (or a one-second tick, which
            // also covers NOTIFYs lost to a reconnect) triggers a re-check.
            let wake = async {
                loop {
                    match listener.try_recv().await {
                        Ok(Some(n)) if n.payload() != id.as_str() => continue,
                        _ => return,
                    }
                }
            };
            let _ = tokio::time::timeout(wait, wake).await;
        }
    }

    /// Applies the request and waits for the sandbox to be ready.
    pub async fn provision(
        &self,
        id: &SandboxId,
        req: &SandboxRequest,
        timeout: Duration,
    ) -> Result<SandboxStatus, ClientError> {
        let generation = self.apply(id, req).await?;
        self.wait_ready(id, generation, timeout).await
    }

    /// Deletes the desired row; sandboxd tears the containers down. True if
    /// the row existed.
    pub async fn release(&self, id: &SandboxId) -> Result<bool, ClientError> {
        Ok(self.store.delete_desired(id).await?)
    }

    /// The current status, if any.
    pub async fn status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, ClientError> {
        Ok(self.store.fetch_status(id).await?)
    }

    /// Every status row.
    pub async fn list(&self) -> Result<Vec<SandboxStatus>, ClientError> {
        Ok(self.store.list_status().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: Phase, observed_generation: i64) -> SandboxStatus {
        SandboxStatus {
            id: SandboxId::parse("agent-7").unwrap(),
            phase,
            observed_generation,
            message: "why".into(),
            services: BTreeMap::new(),
            updated_at: None,
            network: None,
        }
    }

    #[test]
    fn a_waiter_settles_only_on_ready_or_failed_at_its_generation_or_later() {
        assert!(settled(&status(Phase::Ready, 1), 2).is_none());
        assert!(settled(&status(Phase::Failed, 1), 2).is_none());
        assert!(settled(&status(Phase::Provisioning, 2), 2).is_none());
        assert!(settled(&status(Phase::Terminating, 3), 2).is_none());
        assert!(matches!(settled(&status(Phase::Ready, 2), 2), Some(Ok(_))));
        assert!(matches!(settled(&status(Phase::Ready, 3), 2), Some(Ok(_))));
        match settled(&status(Phase::Failed, 2), 2) {
            Some(Err(ClientError::Failed { id, message })) => {
                assert_eq!(id.as_str(), "agent-7");
                assert_eq!(message, "why");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
