//! The Rust API for orchestrators: write the desired row, wait for the
//! sandbox to be ready, release it. Other languages use the same contract
//! in plain SQL (see README).

use crate::id::SandboxId;
use crate::model::{Phase, SandboxStatus};
use crate::store::{self, StoreError};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgPoolOptions};
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
    /// Who asks.
    pub owner: String,
    /// Engines: postgres, redis, mongo.
    pub services: Vec<String>,
    /// Features per engine.
    pub features: BTreeMap<String, BTreeSet<String>>,
    /// When it stops being wanted.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A handle on the state database for orchestrators.
#[derive(Debug, Clone)]
pub struct Client {
    pool: PgPool,
}

impl Client {
    /// Connects to the state database.
    pub async fn connect(database_url: &str) -> Result<Self, ClientError> {
        Ok(Self {
            pool: store::connect(database_url, 4).await?,
        })
    }

    /// Uses an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Writes (inserts or replaces) the desired row; returns its generation.
    pub async fn apply(&self, id: &SandboxId, req: &SandboxRequest) -> Result<i64, ClientError> {
        Ok(store::upsert_desired(
            &self.pool,
            id,
            &req.owner,
            &req.services,
            &req.features,
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
        // The listener gets its own connection, outside the pool: waiters
        // must not starve the pool they read their status with.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*self.pool.connect_options()).clone())
            .await
            .map_err(StoreError::Connect)?;
        let mut listener = PgListener::connect_with(&own)
            .await
            .map_err(StoreError::Connect)?;
        listener
            .listen(store::STATUS_CHANNEL)
            .await
            .map_err(StoreError::Connect)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_phase = "none".to_owned();
        loop {
            // Check after subscribing, and after every wake-up or tick: a
            // NOTIFY lost to a reconnect costs at most one tick.
            if let Some(s) = store::fetch_status(&self.pool, id).await? {
                last_phase = s.phase.to_string();
                if s.observed_generation >= generation {
                    match s.phase {
                        Phase::Ready => return Ok(s),
                        Phase::Failed => {
                            return Err(ClientError::Failed {
                                id: id.clone(),
                                message: s.message,
                            })
                        }
                        _ => {}
                    }
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
        Ok(store::delete_desired(&self.pool, id).await?)
    }

    /// The current status, if any.
    pub async fn status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, ClientError> {
        Ok(store::fetch_status(&self.pool, id).await?)
    }

    /// Every status row.
    pub async fn list(&self) -> Result<Vec<SandboxStatus>, ClientError> {
        Ok(store::list_status(&self.pool).await?)
    }
}
