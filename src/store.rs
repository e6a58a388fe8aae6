//! The Postgres side: migrations, the engine allowlist, desired rows and
//! status rows.

use crate::engine::REGISTRY;
use crate::id::SandboxId;
use crate::model::{DesiredSandbox, Phase, SandboxStatus, ServiceStatus};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Channel NOTIFYed with the id on every change of `sandbox_desired`.
pub const DESIRED_CHANNEL: &str = "sandbox_desired";
/// Channel NOTIFYed with the id on every change of `sandbox_status`.
pub const STATUS_CHANNEL: &str = "sandbox_status";

/// Embedded migrations from `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Failures talking to the state database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached.
    #[error("cannot connect to the state database ({0}); check DATABASE_URL and that Postgres is running")]
    Connect(#[source] sqlx::Error),
    /// Migrations failed.
    #[error(
        "migrating the state database failed ({0}); run `sandboxd migrate` to see the full error"
    )]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("state database {op} failed: {source}")]
    Query {
        /// What sandboxd was doing.
        op: &'static str,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// The database rejected a desired row (see the message for what is allowed).
    #[error("{0}")]
    Rejected(String),
    /// A stored row could not be read back.
    #[error("row {id:?} in {table} is malformed: {reason}")]
    Malformed {
        /// Table name.
        table: &'static str,
        /// Row id.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| match &source {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23514") => {
            StoreError::Rejected(db.message().to_owned())
        }
        _ => StoreError::Query { op, source },
    }
}

/// Opens a pool to the state database.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(StoreError::Connect)
}

/// Applies migrations and rewrites the allowlist from the engine registry.
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    MIGRATOR.run(pool).await.map_err(StoreError::Migrate)?;
    sync_registry(pool).await
}

/// Makes `sandbox_engines` and `sandbox_engine_features` match [`REGISTRY`],
/// so the database validates rows exactly as this binary would.
pub async fn sync_registry(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(query("begin"))?;
    let engines: Vec<String> = REGISTRY.iter().map(|e| e.name().to_owned()).collect();
    let (feature_engines, features): (Vec<String>, Vec<String>) = REGISTRY
        .iter()
        .flat_map(|e| {
            e.allowed_features()
                .iter()
                .map(|f| (e.name().to_owned(), (*f).to_owned()))
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

fn desired_from_row(row: &PgRow) -> Result<DesiredSandbox, StoreError> {
    let raw_id: String = row.get("id");
    let malformed = |reason: String| StoreError::Malformed {
        table: "sandbox_desired",
        id: raw_id.clone(),
        reason,
    };
    let id = SandboxId::parse(&raw_id).map_err(|e| malformed(e.to_string()))?;
    let features_json: serde_json::Value = row.get("features");
    let features: BTreeMap<String, BTreeSet<String>> =
        serde_json::from_value(features_json).map_err(|e| malformed(e.to_string()))?;
    Ok(DesiredSandbox {
        id,
        owner: row.get("owner"),
        services: row.get("services"),
        features,
        expires_at: row.get("expires_at"),
        generation: row.get("generation"),
        updated_at: row.get("updated_at"),
    })
}

/// Reads one desired row.
pub async fn fetch_desired(
    pool: &PgPool,
    id: &SandboxId,
) -> Result<Option<DesiredSandbox>, StoreError> {
    let row = sqlx::query(
        "SELECT id, owner, services, features, expires_at, generation, updated_at
         FROM sandbox_desired WHERE id = $1",
    )
    .bind(id.as_str())
    .fetch_optional(pool)
    .await
    .map_err(query("read desired row"))?;
    row.as_ref().map(desired_from_row).transpose()
}

/// Ids of every desired row and every status row (the relist of the database side).
pub async fn list_ids(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    sqlx::query_scalar("SELECT id FROM sandbox_desired UNION SELECT id FROM sandbox_status")
        .fetch_all(pool)
        .await
        .map_err(query("list ids"))
}

/// Inserts or replaces a desired row (the orchestrator's write). Returns the
/// generation the database assigned.
pub async fn upsert_desired(
    pool: &PgPool,
    id: &SandboxId,
    owner: &str,
    services: &[String],
    features: &BTreeMap<String, BTreeSet<String>>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<i64, StoreError> {
    let features = serde_json::to_value(features).expect("a map of string sets is valid JSON");
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
    .fetch_one(pool)
    .await
    .map_err(query("write desired row"))
}

/// Deletes a desired row; true if it existed.
pub async fn delete_desired(pool: &PgPool, id: &SandboxId) -> Result<bool, StoreError> {
    let done = sqlx::query("DELETE FROM sandbox_desired WHERE id = $1")
        .bind(id.as_str())
        .execute(pool)
        .await
        .map_err(query("delete desired row"))?;
    Ok(done.rows_affected() > 0)
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
        updated_at: row.get("updated_at"),
    })
}

const STATUS_COLUMNS: &str = "id, phase, observed_generation, message, services, updated_at";

/// Reads one status row.
pub async fn fetch_status(
    pool: &PgPool,
    id: &SandboxId,
) -> Result<Option<SandboxStatus>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {STATUS_COLUMNS} FROM sandbox_status WHERE id = $1"
    ))
    .bind(id.as_str())
    .fetch_optional(pool)
    .await
    .map_err(query("read status row"))?;
    row.as_ref().map(status_from_row).transpose()
}

/// Reads every status row, ordered by id.
pub async fn list_status(pool: &PgPool) -> Result<Vec<SandboxStatus>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {STATUS_COLUMNS} FROM sandbox_status ORDER BY id"
    ))
    .fetch_all(pool)
    .await
    .map_err(query("list status rows"))?;
    rows.iter().map(status_from_row).collect()
}

/// Writes a status row. Unchanged content is not rewritten, so waiting
/// orchestrators are not woken for nothing.
pub async fn write_status(
    pool: &PgPool,
    id: &SandboxId,
    phase: Phase,
    observed_generation: i64,
    message: &str,
    services: &BTreeMap<String, ServiceStatus>,
) -> Result<(), StoreError> {
    let services = serde_json::to_value(services).expect("service status is valid JSON");
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
    .bind(phase.as_str())
    .bind(observed_generation)
    .bind(message)
    .bind(services)
    .execute(pool)
    .await
    .map_err(query("write status row"))?;
    Ok(())
}

/// Deletes a status row.
pub async fn delete_status(pool: &PgPool, id: &SandboxId) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM sandbox_status WHERE id = $1")
        .bind(id.as_str())
        .execute(pool)
        .await
        .map_err(query("delete status row"))?;
    Ok(())
}
