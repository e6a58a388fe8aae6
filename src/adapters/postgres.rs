//! The Postgres adapter: [`Store`] over sqlx, the migrations, the engine
//! allowlist sync, the orchestrator's writes, and the one LISTEN helper
//! that the controller's watcher and the client's waiters share.

use crate::domain::id::SandboxId;
use crate::domain::sandbox::{DesiredSandbox, Phase, SandboxStatus};
use crate::domain::status::StatusUpdate;
use crate::engine::{Registry, REGISTRY};
use crate::ports::store::{NotifyStream, Store, StoreError};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use sqlx::postgres::{PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Channel NOTIFYed with the id on every change of `sandbox_desired`.
pub const DESIRED_CHANNEL: &str = "sandbox_desired";
/// Channel NOTIFYed with the id on every change of `sandbox_status`.
pub const STATUS_CHANNEL: &str = "sandbox_status";

/// Embedded migrations from `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| match &source {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23514") => {
            StoreError::Rejected(db.message().to_owned())
        }
        _ => StoreError::Query {
            op,
            source: Box::new(source),
        },
    }
}

fn connect_error(e: sqlx::Error) -> StoreError {
    StoreError::Connect(Box::new(e))
}

/// A listener subscribed to `channels` on a connection of its own, outside
/// `pool`, so that waiting never holds one of the pool's connections.
pub async fn listen(pool: &PgPool, channels: &[&str]) -> Result<PgListener, StoreError> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .map_err(connect_error)?;
    let mut listener = PgListener::connect_with(&own)
        .await
        .map_err(connect_error)?;
    listener
        .listen_all(channels.iter().copied())
        .await
        .map_err(connect_error)?;
    Ok(listener)
}

/// sandboxd's state database.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    registry: Registry,
}

impl PgStore {
    /// Opens a pool of at most `max_connections` to the database at `url`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(connect_error)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            registry: REGISTRY,
        }
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies migrations and rewrites the allowlist from the engine registry.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Migrate(Box::new(e)))?;
        self.sync_registry().await
    }

    /// Makes `sandbox_engines` and `sandbox_engine_features` match the
    /// registry, so the database validates rows exactly as this binary would.
    async fn sync_registry(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(query("begin"))?;
        let engines: Vec<String> = self
            .registry
            .iter()
            .map(|e| e.name().as_str().to_owned())
            .collect();
        let (feature_engines, features): (Vec<String>, Vec<String>) = self
            .registry
            .iter()
            .flat_map(|e| {
                e.allowed_features()
                    .iter()
                    .map(|f| (e.name().as_str().to_owned(), (*f).to_owned()))
            })
            .unzip();
        sqlx::query(
            "INSERT INTO sandbox_engines (engine) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
        )
        .bind(&engines)
        .execute(&mut *tx)
        .await
        .map_err(query("sync engines"))?;
        sqlx::query("DELETE FROM sandbox_engines WHERE NOT (engine = ANY ($1))")
            .bind(&engines)
            .execute(&mut *tx)
            .await
            .map_err(query("sync engines"))?;
        sqlx::query("DELETE FROM sandbox_engine_features")
            .execute(&mut *tx)
            .await
            .map_err(query("sync features"))?;
        sqlx::query(
            "INSERT INTO sandbox_engine_features (engine, feature) SELECT * FROM unnest($1::text[], $2::text[])",
        )
        .bind(&feature_engines)
        .bind(&features)
        .execute(&mut *tx)
        .await
        .map_err(query("sync features"))?;
        tx.commit().await.map_err(query("commit"))
    }

    /// Inserts or replaces a desired row (the orchestrator's write). Returns
    /// the generation the database assigned.
    pub async fn upsert_desired(
        &self,
        id: &SandboxId,
        owner: &str,
        services: &[String],
        features: &BTreeMap<String, BTreeSet<String>>,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<i64, StoreError> {
        let features = serde_json::json!(features);
        sqlx::query_scalar(
            "INSERT INTO sandbox_desired (id, owner, services, features, expires_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, services = EXCLUDED.services,
                 features = EXCLUDED.features, expires_at = EXCLUDED.expires_at
             RETURNING generation",
        )
        .bind(id.as_str())
        .bind(owner)
        .bind(services)
        .bind(features)
        .bind(expires_at)
        .fetch_one(&self.pool)
        .await
        .map_err(query("write desired row"))
    }

    /// Deletes a desired row; true if it existed.
    pub async fn delete_desired(&self, id: &SandboxId) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM sandbox_desired WHERE id = $1")
            .bind(id.as_str())
            .execute(&self.pool)
            .await
            .map_err(query("delete desired row"))?;
        Ok(done.rows_affected() > 0)
    }

    /// Reads a desired row, resolving its engine names once, here: names
    /// this binary does not know end up in `unknown_services`.
    fn desired_from_row(&self, row: &PgRow) -> Result<DesiredSandbox, StoreError> {
        let raw_id: String = row.get("id");
        let malformed = |reason: String| StoreError::Malformed {
            table: "sandbox_desired",
            id: raw_id.clone(),
            reason,
        };
        let id = SandboxId::parse(&raw_id).map_err(|e| malformed(e.to_string()))?;
        let raw_services: Vec<String> = row.get("services");
        let mut services = Vec::new();
        let mut unknown_services = Vec::new();
        for name in raw_services {
            match self.registry.lookup(&name) {
                Some(engine) => services.push(engine.name()),
                None => unknown_services.push(name),
            }
        }
        let features_json: serde_json::Value = row.get("features");
        let raw_features: BTreeMap<String, BTreeSet<String>> =
            serde_json::from_value(features_json).map_err(|e| malformed(e.to_string()))?;
        let features = raw_features
            .into_iter()
            .filter_map(|(name, set)| Some((self.registry.lookup(&name)?.name(), set)))
            .collect();
        Ok(DesiredSandbox {
            id,
            owner: row.get("owner"),
            services,
            unknown_services,
            features,
            attach: Vec::new(),
            invalid: None,
            expires_at: row.get("expires_at"),
            generation: row.get("generation"),
            updated_at: row.get("updated_at"),
        })
    }
}

fn status_from_row(row: &PgRow) -> Result<SandboxStatus, StoreError> {
    let raw_id: String = row.get("id");
    let malformed = |reason: String| StoreError::Malformed {
        table: "sandbox_status",
        id: raw_id.clone(),
        reason,
    };
    let phase: String = row.get("phase");
    let services: serde_json::Value = row.get("services");
    Ok(SandboxStatus {
        id: SandboxId::parse(&raw_id).map_err(|e| malformed(e.to_string()))?,
        phase: Phase::parse(&phase).ok_or_else(|| malformed(format!("unknown phase {phase:?}")))?,
        observed_generation: row.get("observed_generation"),
        message: row.get("message"),
        services: serde_json::from_value(services).map_err(|e| malformed(e.to_string()))?,
        network: None,
        updated_at: row.get("updated_at"),
    })
}

const STATUS_COLUMNS: &str = "id, phase, observed_generation, message, services, updated_at";

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(query("ping"))?;
        Ok(())
    }

    async fn fetch_desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, StoreError> {
        let row = sqlx::query(
            "SELECT id, owner, services, features, expires_at, generation, updated_at
             FROM sandbox_desired WHERE id = $1",
        )
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query("read desired row"))?;
        row.map(|r| self.desired_from_row(&r)).transpose()
    }

    async fn fetch_status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {STATUS_COLUMNS} FROM sandbox_status WHERE id = $1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query("read status row"))?;
        row.as_ref().map(status_from_row).transpose()
    }

    async fn list_ids(&self) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT id FROM sandbox_desired UNION SELECT id FROM sandbox_status")
            .fetch_all(&self.pool)
            .await
            .map_err(query("list ids"))
    }

    async fn list_status(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {STATUS_COLUMNS} FROM sandbox_status ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(query("list status rows"))?;
        rows.iter().map(status_from_row).collect()
    }

    /// Unchanged content is not rewritten, so waiting orchestrators are not
    /// woken for nothing.
    async fn write_status(&self, id: &SandboxId, update: &StatusUpdate) -> Result<(), StoreError> {
        let services = serde_json::json!(update.services);
        sqlx::query(
            "INSERT INTO sandbox_status (id, phase, observed_generation, message, services, updated_at)
             VALUES ($1, $2, $3, $4, $5, now())
             ON CONFLICT (id) DO UPDATE SET phase = EXCLUDED.phase,
                 observed_generation = EXCLUDED.observed_generation, message = EXCLUDED.message,
                 services = EXCLUDED.services, updated_at = now()
             WHERE (sandbox_status.phase, sandbox_status.observed_generation, sandbox_status.message,
                    sandbox_status.services)
                   IS DISTINCT FROM
                   (EXCLUDED.phase, EXCLUDED.observed_generation, EXCLUDED.message, EXCLUDED.services)",
        )
        .bind(id.as_str())
        .bind(update.phase.as_str())
        .bind(update.observed_generation)
        .bind(&update.message)
        .bind(services)
        .execute(&self.pool)
        .await
        .map_err(query("write status row"))?;
        Ok(())
    }

    async fn delete_status(&self, id: &SandboxId) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sandbox_status WHERE id = $1")
            .bind(id.as_str())
            .execute(&self.pool)
            .await
            .map_err(query("delete status row"))?;
        Ok(())
    }

    async fn watch_desired(&self) -> Result<NotifyStream, StoreError> {
        let listener = listen(&self.pool, &[DESIRED_CHANNEL]).await?;
        // `try_recv` answers `Ok(None)` when the connection drops: end the
        // stream there, so the watcher reconnects and relists.
        let stream = futures::stream::unfold(Some(listener), |listener| async move {
            let mut listener = listener?;
            match listener.try_recv().await {
                Ok(Some(n)) => Some((Ok(n.payload().to_owned()), Some(listener))),
                Ok(None) => None,
                Err(e) => Some((Err(connect_error(e)), None)),
            }
        });
        Ok(stream.boxed())
    }
}
