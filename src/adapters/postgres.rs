//! The Postgres adapter: [`Store`] over sqlx, the migrations, the engine
//! allowlist sync, the orchestrator's writes, registering orchestrator
//! roles, and the one LISTEN helper that the controller's watcher and the
//! client's waiters share.
//!
//! Desired rows are read in forms that always decode (arrays as JSON text
//! with their shape alongside, times only when finite and in range): a row
//! that got past the database's checks (a superuser with triggers disabled)
//! comes back with [`DesiredSandbox::invalid`] set instead of failing the
//! read or panicking in a decoder: this module reads the columns, and
//! `domain::desired_row` holds the rules.

use crate::domain::breaker::ReapingState;
use crate::domain::checkpoint::{Checkpoint, Outcome, Reset, Work};
use crate::domain::desired_row::{
    self, shown, Cell, DesiredRow, KnownEngine, ListColumn, Unreadable, MAX_ATTACH,
    MAX_FEATURES_BYTES, MAX_SERVICES,
};
use crate::domain::event::RecordedEvent;
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::identity::{Incarnation, StateId};
use crate::domain::lease::{LeaseHolder, Term};
use crate::domain::pool::PoolClaim;
use crate::domain::sandbox::{DesiredSandbox, Phase, SandboxStatus, Services};
use crate::domain::seed::{self, SeedHash, SeedInfo};
use crate::domain::status::StatusUpdate;
use crate::engine::Registry;
use crate::ports::store::{EventBatch, NotifyStream, Store, StoreError};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use std::str::FromStr;
use std::time::Duration;

mod notify;
mod quota;
pub mod schema;
pub use self::quota::{QuotaLimits, QuotaLine, QuotaSettings, Setting as QuotaSetting};

/// Channel NOTIFYed with the row's incarnation (never its id: any role may
/// listen) on every change of `sandbox_desired` that asks something new.
pub const DESIRED_CHANNEL: &str = "sandbox_desired";
/// Channel NOTIFYed with the status's incarnation (never its id) on every
/// change of `sandbox_status`.
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

/// Like [`query`], but the fence trigger's refusal (SQLSTATE `SX001`)
/// becomes [`StoreError::Fenced`].
fn fenced(term: Term, op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| match e.as_database_error().and_then(|d| d.code()) {
        Some(code) if code == "SX001" => StoreError::Fenced { term },
        _ => query(op)(e),
    }
}

/// Whole milliseconds of `d`, as Postgres' bigint.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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

/// The server-side bound on one statement of a [`PgStore::connect`] pool
/// (migrations included).
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// sandboxd's state database.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    registry: Registry,
}

impl PgStore {
    /// A store over `pool` whose desired rows name the engines of
    /// `engines` (names it lacks make a row fail), and whose [`migrate`]
    /// writes their allowlist.
    ///
    /// [`migrate`]: PgStore::migrate
    pub fn with_engines(pool: PgPool, engines: Registry) -> Self {
        Self {
            pool,
            registry: engines,
        }
    }

    /// Opens a pool of at most `max_connections` to the database at `url`
    /// whose sessions the server bounds: a statement is cancelled after
    /// `statement_timeout`, and a wait for a lock after half of it (so a
    /// lock held elsewhere fails with a lock timeout that names the cause,
    /// and frees the connection, instead of queueing). See
    /// [`PgStore::with_engines`] for `engines`.
    pub async fn connect_with_engines(
        url: &str,
        max_connections: u32,
        statement_timeout: Duration,
        engines: Registry,
    ) -> Result<Self, StoreError> {
        let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128);
        let options = PgConnectOptions::from_str(url)
            .map_err(connect_error)?
            .options([
                ("statement_timeout", ms(statement_timeout)),
                ("lock_timeout", ms(statement_timeout / 2)),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(connect_error)?;
        Ok(Self::with_engines(pool, engines))
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Adopts a database made by the migrations before the baseline,
    /// applies migrations, then the functions, triggers, policies and
    /// grants of `sql/` ([`schema`]), and rewrites the allowlist from the
    /// engine registry.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let failed = |e: schema::SchemaError| StoreError::Migrate(Box::new(e));
        if schema::adopt_legacy(&self.pool).await.map_err(failed)? == schema::Adoption::Adopted {
            tracing::info!("adopted a state database made by the 14 migrations before the baseline: its rows are kept, its records are now the baseline's");
        }
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Migrate(Box::new(e)))?;
        schema::apply(&self.pool, &schema::objects())
            .await
            .map_err(failed)?;
        self.sync_registry().await
    }

    /// Makes `sandbox_engines` and `sandbox_engine_features` match the
    /// registry, so the database validates rows exactly as this binary would.
    /// Replicas starting at once run it at once: every statement leaves
    /// what another replica's just wrote (no delete-all then insert, whose
    /// insert would collide with the other's).
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
        sqlx::query(
            "DELETE FROM sandbox_engine_features f WHERE NOT EXISTS (
                 SELECT 1 FROM unnest($1::text[], $2::text[]) AS w(engine, feature)
                 WHERE w.engine = f.engine AND w.feature = f.feature)",
        )
        .bind(&feature_engines)
        .bind(&features)
        .execute(&mut *tx)
        .await
        .map_err(query("sync features"))?;
        sqlx::query("DELETE FROM sandbox_engines WHERE NOT (engine = ANY ($1))")
            .bind(&engines)
            .execute(&mut *tx)
            .await
            .map_err(query("sync engines"))?;
        sqlx::query(
            "INSERT INTO sandbox_engine_features (engine, feature)
             SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING",
        )
        .bind(&feature_engines)
        .bind(&features)
        .execute(&mut *tx)
        .await
        .map_err(query("sync features"))?;
        tx.commit().await.map_err(query("commit"))
    }

    /// The newest `limit` events of sandbox `id`, oldest first (what the
    /// connecting role may see of them).
    pub async fn events(
        &self,
        id: &SandboxId,
        limit: u32,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        type Row = (
            DateTime<Utc>,
            DateTime<Utc>,
            i32,
            String,
            Option<String>,
            Option<String>,
            String,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT last_at, first_at, count, reason, engine, detail, message FROM (
                 SELECT * FROM sandbox_events WHERE sandbox_id = $1 ORDER BY seq DESC LIMIT $2
             ) newest ORDER BY seq",
        )
        .bind(id.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(query("read events"))?;
        Ok(rows
            .into_iter()
            .map(
                |(last_at, first_at, count, reason, engine, detail, message)| RecordedEvent {
                    last_at,
                    first_at,
                    count,
                    reason,
                    engine,
                    detail,
                    message,
                },
            )
            .collect())
    }

    /// Resumes reaping after the breaker paused it (`sandbox_resume_reaping`,
    /// which wakes the controller): what the pause was, if reaping was
    /// paused. Only the owner of sandboxd's tables may do this.
    pub async fn resume_reaping(&self) -> Result<Option<ReapingState>, StoreError> {
        let row = sqlx::query("SELECT was_paused, reason, paused_at FROM sandbox_resume_reaping()")
            .fetch_one(&self.pool)
            .await
            .map_err(query("resume reaping"))?;
        let paused: bool = row.get("was_paused");
        Ok(paused.then(|| ReapingState {
            paused,
            reason: row.get("reason"),
            paused_at: row.get("paused_at"),
        }))
    }

    /// Registers `role` as an orchestrator (`sandbox_grant_orchestrator`):
    /// it may write `sandbox_desired` and read `sandbox_status` and the
    /// allowlist, nothing else; with `own_rows_only`, only rows whose owner
    /// is `role`. Only the owner of sandboxd's tables may do this.
    pub async fn grant_orchestrator(
        &self,
        role: &str,
        own_rows_only: bool,
    ) -> Result<(), RoleError> {
        check_role_name(role)?;
        sqlx::query("SELECT sandbox_grant_orchestrator($1::text::name, $2)")
            .bind(role)
            .bind(own_rows_only)
            .execute(&self.pool)
            .await
            .map_err(|e| role_error(role, e))?;
        Ok(())
    }

    /// Revokes what [`PgStore::grant_orchestrator`] granted and unregisters
    /// `role`; true if it was registered.
    pub async fn revoke_orchestrator(&self, role: &str) -> Result<bool, RoleError> {
        check_role_name(role)?;
        sqlx::query_scalar("SELECT sandbox_revoke_orchestrator($1::text::name)")
            .bind(role)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| role_error(role, e))
    }

    /// Reads a desired row selected with [`DESIRED_COLUMNS`], resolving its
    /// engine names with this store's registry (see
    /// [`desired_row::desired_from_row`]).
    fn desired_from_row(&self, id: &SandboxId, row: &PgRow) -> DesiredSandbox {
        desired_row::desired_from_row(id, read_desired(row), |name| {
            self.registry.lookup(name).map(|e| KnownEngine {
                name: e.name(),
                allowed_features: e.allowed_features(),
            })
        })
    }
}

impl PgStore {
    /// Opens a pool of at most `max_connections` to the database at `url`,
    /// every statement bounded by the server after
    /// [`DEFAULT_STATEMENT_TIMEOUT`]. See [`PgStore::with_engines`] for
    /// `engines` (a client passes the engines it was built with,
    /// [`crate::engine::REGISTRY`]).
    pub async fn connect(
        url: &str,
        max_connections: u32,
        engines: Registry,
    ) -> Result<Self, StoreError> {
        Self::connect_with_engines(url, max_connections, DEFAULT_STATEMENT_TIMEOUT, engines).await
    }
}

/// The columns of `sandbox_desired` in forms that always decode: arrays as
/// JSON text (only up to $2 services, $4 containers) with their shape,
/// `features` as text (only up to $3 bytes stored), times only when finite
/// and within what the decoder takes. `left(owner, 201)`: one more than
/// `desired_row::MAX_OWNER_CHARS`.
const DESIRED_COLUMNS: &str = "left(owner, 201) AS owner,
    cardinality(services) AS services_len, array_ndims(services) AS services_ndims,
    array_lower(services, 1) AS services_lower,
    CASE WHEN cardinality(services) <= $1 THEN to_jsonb(services)::text END AS services,
    CASE WHEN pg_column_size(features) <= $2 THEN features::text END AS features,
    cardinality(attach) AS attach_len, array_ndims(attach) AS attach_ndims,
    array_lower(attach, 1) AS attach_lower,
    CASE WHEN cardinality(attach) <= $3 THEN to_jsonb(attach)::text END AS attach,
    expires_at IS NOT NULL AS has_expiry,
    CASE WHEN isfinite(expires_at) AND expires_at < '10000-01-01 00:00:00+00' THEN expires_at END
        AS expires_at,
    coalesce(isfinite(updated_at) AND updated_at < '10000-01-01 00:00:00+00', false) AS updated_at_ok,
    CASE WHEN isfinite(updated_at) AND updated_at < '10000-01-01 00:00:00+00' THEN updated_at
         ELSE now() END AS updated_at,
    CASE WHEN isfinite(last_used_at) AND last_used_at < '10000-01-01 00:00:00+00' THEN last_used_at
         END AS last_used_at,
    EXTRACT(EPOCH FROM idle_timeout)::float8 AS idle_timeout_secs,
    persistent,
    left(idle_action, 16) AS idle_action,
    left(owner_container, 129) AS owner_container,
    left(isolation, 16) AS isolation,
    CASE WHEN pg_column_size(seeds) <= $2 THEN seeds::text END AS seeds,
    left(fork_of, 64) AS fork_of, fork_of_incarnation::text AS fork_of_incarnation,
    generation, incarnation::text AS incarnation,
    CASE WHEN isfinite(created_at) AND created_at < '10000-01-01 00:00:00+00' THEN created_at
         END AS created_at";

/// The columns of a row selected with [`DESIRED_COLUMNS`], each as read
/// or [`Unreadable`].
fn read_desired(row: &PgRow) -> DesiredRow {
    fn cell<'r, T>(row: &'r PgRow, name: &str) -> Cell<T>
    where
        T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        row.try_get::<T, _>(name).map_err(|_| Unreadable)
    }
    let list = |name: &str| ListColumn {
        len: cell(row, &format!("{name}_len")),
        ndims: cell(row, &format!("{name}_ndims")),
        lower: cell(row, &format!("{name}_lower")),
        json: cell(row, name),
    };
    DesiredRow {
        owner: cell(row, "owner"),
        services: list("services"),
        features: cell(row, "features"),
        attach: list("attach"),
        has_expiry: cell(row, "has_expiry"),
        expires_at: cell(row, "expires_at"),
        updated_at_ok: cell(row, "updated_at_ok"),
        updated_at: cell(row, "updated_at"),
        generation: cell(row, "generation"),
        incarnation: cell(row, "incarnation"),
        last_used_at: cell(row, "last_used_at"),
        idle_timeout_secs: cell(row, "idle_timeout_secs"),
        persistent: cell(row, "persistent"),
        idle_action: cell(row, "idle_action"),
        owner_container: cell(row, "owner_container"),
        created_at: cell(row, "created_at"),
        isolation: cell(row, "isolation"),
        seeds: cell(row, "seeds"),
        fork_of: cell(row, "fork_of"),
        fork_of_incarnation: cell(row, "fork_of_incarnation"),
    }
}

/// Failures of registering or unregistering an orchestrator role.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The name cannot be a Postgres role name.
    #[error("invalid role name {0:?}: use 1 to 63 bytes without control characters")]
    InvalidName(String),
    /// No such role in the cluster.
    #[error("role {0:?} does not exist: create it first as a superuser of the state database \
             (CREATE ROLE \"{0}\" LOGIN PASSWORD '...'), then run `sandboxd grant-orchestrator {0}` again")]
    NoSuchRole(String),
    /// The connecting role does not own sandboxd's tables.
    #[error("only the role that owns sandboxd's tables (the controller's, which runs `sandboxd migrate`) \
             may grant or revoke orchestrators: use the controller's DATABASE_URL")]
    NotOwner,
    /// The migrations that define the functions have not run.
    #[error("the state database has no orchestrator functions: run `sandboxd migrate` (or start the controller) first")]
    NotMigrated,
    /// The database refused the role (the message says why and what to do).
    #[error("{0}")]
    Refused(String),
    /// Any other failure of the state database.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn check_role_name(role: &str) -> Result<(), RoleError> {
    if role.is_empty() || role.len() > 63 || role.chars().any(char::is_control) {
        return Err(RoleError::InvalidName(role.chars().take(80).collect()));
    }
    Ok(())
}

fn role_error(role: &str, e: sqlx::Error) -> RoleError {
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    match code.as_deref() {
        Some("42704") => RoleError::NoSuchRole(role.to_owned()),
        Some("42501") => RoleError::NotOwner,
        Some("42883") | Some("42P01") => RoleError::NotMigrated,
        Some("22023") => RoleError::Refused(
            e.as_database_error()
                .map(|d| d.message().to_owned())
                .unwrap_or_default(),
        ),
        _ => RoleError::Store(query("register orchestrator role")(e)),
    }
}

fn status_from_row(row: &PgRow) -> Result<SandboxStatus, StoreError> {
    let raw_id: String = row.try_get("id").map_err(query("read status row"))?;
    let malformed = |reason: String| StoreError::Malformed {
        table: "sandbox_status",
        id: raw_id.chars().take(80).collect(),
        reason,
    };
    let column = |e: sqlx::Error| malformed(e.to_string());
    let phase: String = row.try_get("phase").map_err(column)?;
    let services: String = row.try_get("services").map_err(column)?;
    let services: Services =
        serde_json::from_str(&services).map_err(|e| malformed(e.to_string()))?;
    let incarnation: Option<String> = row.try_get("incarnation").map_err(column)?;
    Ok(SandboxStatus {
        id: SandboxId::parse(&raw_id).map_err(|e| malformed(e.to_string()))?,
        phase: Phase::parse(&phase).ok_or_else(|| malformed(format!("unknown phase {phase:?}")))?,
        observed_generation: row.try_get("observed_generation").map_err(column)?,
        message: row.try_get("message").map_err(column)?,
        services,
        network: row.try_get("network").map_err(column)?,
        updated_at: row.try_get("updated_at").map_err(column)?,
        incarnation: incarnation
            .map(|text| Incarnation::parse(&text))
            .transpose()
            .map_err(|e| malformed(e.to_string()))?,
    })
}

/// The columns of `sandbox_status` but `services` (selected as
/// [`SERVICES`] or [`REDACTED_SERVICES`]); `updated_at` only when the
/// decoder takes it.
const STATUS_COLUMNS: &str =
    "id, phase, observed_generation, message, network, incarnation::text AS incarnation,
    CASE WHEN isfinite(updated_at) AND updated_at < '10000-01-01 00:00:00+00' THEN updated_at END
        AS updated_at";

/// `services` as text, parsed into its type directly.
const SERVICES: &str = "services::text AS services";

/// `services` as text with each engine's `password`, `url` and `env`
/// emptied (anything that is not an object of objects is left as it is,
/// for the parser to refuse): the database's one definition of a status's
/// credentials, which its triggers also strip.
const REDACTED_SERVICES: &str = "sandbox_status_without_credentials(services)::text AS services";

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(query("ping"))?;
        Ok(())
    }

    async fn state_id(&self) -> Result<StateId, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT state_id::text FROM sandbox_identity")
            .fetch_all(&self.pool)
            .await
            .map_err(
                |e| match e.as_database_error().and_then(|d| d.code()).as_deref() {
                    Some("42P01") => {
                        StoreError::NoIdentity("table sandbox_identity does not exist".into())
                    }
                    _ => query("read identity")(e),
                },
            )?;
        match ids.as_slice() {
            [one] => StateId::parse(one).map_err(|e| StoreError::NoIdentity(e.to_string())),
            [] => Err(StoreError::NoIdentity(
                "table sandbox_identity is empty".into(),
            )),
            more => Err(StoreError::NoIdentity(format!(
                "table sandbox_identity holds {} rows",
                more.len()
            ))),
        }
    }

    async fn fetch_desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {DESIRED_COLUMNS} FROM sandbox_desired WHERE id = $4"
        ))
        .bind(MAX_SERVICES)
        .bind(MAX_FEATURES_BYTES)
        .bind(MAX_ATTACH)
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query("read desired row"))?;
        Ok(row.map(|r| self.desired_from_row(id, &r)))
    }

    async fn list_desired(&self) -> Result<Vec<DesiredSandbox>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT id, {DESIRED_COLUMNS} FROM sandbox_desired"
        ))
        .bind(MAX_SERVICES)
        .bind(MAX_FEATURES_BYTES)
        .bind(MAX_ATTACH)
        .fetch_all(&self.pool)
        .await
        .map_err(query("list desired rows"))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let raw: String = r.get("id");
                match SandboxId::parse(&raw) {
                    Ok(id) => Some(self.desired_from_row(&id, r)),
                    Err(e) => {
                        tracing::warn!(id = shown(&raw), error = %e, "skipping a desired row with an invalid id");
                        None
                    }
                }
            })
            .collect())
    }

    async fn fetch_status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {STATUS_COLUMNS}, {SERVICES} FROM sandbox_status WHERE id = $1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(query("read status row"))?;
        row.as_ref().map(status_from_row).transpose()
    }

    async fn desired_ids(&self) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT id FROM sandbox_desired")
            .fetch_all(&self.pool)
            .await
            .map_err(query("list desired ids"))
    }

    async fn mark_used(
        &self,
        id: &SandboxId,
        at: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        // The lifecycle trigger keeps it at most now() and never backwards.
        sqlx::query_scalar(
            "UPDATE sandbox_desired SET last_used_at = $2 WHERE id = $1 RETURNING last_used_at",
        )
        .bind(id.as_str())
        .bind(at)
        .fetch_optional(&self.pool)
        .await
        .map_err(query("record a use of the sandbox"))
    }

    async fn released_ids(&self, keep: Duration) -> Result<Vec<String>, StoreError> {
        sqlx::query("DELETE FROM sandbox_released WHERE released_at < now() - $1 * interval '1 millisecond'")
            .bind(millis(keep))
            .execute(&self.pool)
            .await
            .map_err(query("prune released ids"))?;
        sqlx::query_scalar("SELECT id FROM sandbox_released")
            .fetch_all(&self.pool)
            .await
            .map_err(query("list released ids"))
    }

    async fn reaping(&self) -> Result<ReapingState, StoreError> {
        let row = sqlx::query("SELECT paused, reason, paused_at FROM sandbox_reaping")
            .fetch_optional(&self.pool)
            .await
            .map_err(query("read the reaping breaker"))?;
        Ok(row.map_or_else(ReapingState::default, |r| ReapingState {
            paused: r.get("paused"),
            reason: r.get("reason"),
            paused_at: r.get("paused_at"),
        }))
    }

    async fn pause_reaping(&self, reason: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT sandbox_pause_reaping($1)")
            .bind(reason)
            .execute(&self.pool)
            .await
            .map_err(query("pause reaping"))?;
        Ok(())
    }

    async fn list_status(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {STATUS_COLUMNS}, {SERVICES} FROM sandbox_status ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(query("list status rows"))?;
        rows.iter().map(status_from_row).collect()
    }

    /// The secrets are blanked in the database, so they are neither sent
    /// nor parsed.
    async fn list_status_redacted(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {STATUS_COLUMNS}, {REDACTED_SERVICES} FROM sandbox_status ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(query("list status rows"))?;
        rows.iter().map(status_from_row).collect()
    }

    /// Unchanged content is not rewritten, so waiting orchestrators are not
    /// woken for nothing.
    async fn write_status(
        &self,
        id: &SandboxId,
        update: &StatusUpdate,
        term: Term,
    ) -> Result<(), StoreError> {
        let services = serde_json::json!(update.services);
        sqlx::query(
            "INSERT INTO sandbox_status (id, phase, observed_generation, message, services, network,
                                         incarnation, updated_at, leader_term)
             VALUES ($1, $2, $3, $4, $5, $6, $7::uuid, now(), $8)
             ON CONFLICT (id) DO UPDATE SET phase = EXCLUDED.phase,
                 observed_generation = EXCLUDED.observed_generation, message = EXCLUDED.message,
                 services = EXCLUDED.services, network = EXCLUDED.network,
                 incarnation = EXCLUDED.incarnation, updated_at = now(),
                 leader_term = EXCLUDED.leader_term
             WHERE (sandbox_status.phase, sandbox_status.observed_generation, sandbox_status.message,
                    sandbox_status.services, sandbox_status.network, sandbox_status.incarnation)
                   IS DISTINCT FROM
                   (EXCLUDED.phase, EXCLUDED.observed_generation, EXCLUDED.message, EXCLUDED.services,
                    EXCLUDED.network, EXCLUDED.incarnation)",
        )
        .bind(id.as_str())
        .bind(update.phase.as_str())
        .bind(update.observed_generation)
        .bind(&update.message)
        .bind(services)
        .bind(update.network.as_deref())
        .bind(update.incarnation.as_ref().map(Incarnation::as_str))
        .bind(term.0)
        .execute(&self.pool)
        .await
        .map_err(fenced(term, "write status row"))?;
        Ok(())
    }

    async fn delete_status(&self, id: &SandboxId, term: Term) -> Result<(), StoreError> {
        // A delete fires no row trigger that could see the term: the
        // statement checks the lease itself, and says whether it was valid.
        let valid: bool = sqlx::query_scalar(
            "WITH lease AS (SELECT sandbox_lease_valid($2) AS valid),
                  gone AS (DELETE FROM sandbox_status WHERE id = $1 AND (SELECT valid FROM lease))
             SELECT valid FROM lease",
        )
        .bind(id.as_str())
        .bind(term.0)
        .fetch_one(&self.pool)
        .await
        .map_err(query("delete status row"))?;
        if valid {
            Ok(())
        } else {
            Err(StoreError::Fenced { term })
        }
    }

    async fn pool_claims(&self) -> Result<Vec<PoolClaim>, StoreError> {
        let rows = sqlx::query(
            "SELECT container, sandbox_id, engine, generation, incarnation, owner, features, instance, seed
               FROM sandbox_pool_claims ORDER BY container",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(query("read pool claims"))?;
        rows.iter()
            .map(|r| {
                let container: String = r.get("container");
                let raw: String = r.get("sandbox_id");
                let sandbox = SandboxId::parse(&raw).map_err(|e| StoreError::Malformed {
                    table: "sandbox_pool_claims",
                    id: container.clone(),
                    reason: e.to_string(),
                })?;
                let features: Vec<String> = r.get("features");
                Ok(PoolClaim {
                    container: ContainerId::new(container),
                    sandbox,
                    engine: r.get("engine"),
                    generation: r.get("generation"),
                    incarnation: r.get("incarnation"),
                    owner: r.get("owner"),
                    features: features.into_iter().collect(),
                    instance: r.get("instance"),
                    seed: r
                        .get::<Option<String>, _>("seed")
                        .and_then(|s| SeedHash::parse(&s)),
                })
            })
            .collect()
    }

    async fn seed(&self, hash: &SeedHash) -> Result<Option<SeedInfo>, StoreError> {
        let row = sqlx::query(
            "SELECT engine, size_bytes, substring(content FROM 1 FOR $2) AS head
               FROM sandbox_seeds WHERE hash = $1 LIMIT 1",
        )
        .bind(hash.as_str())
        .bind(seed::HEAD_BYTES as i32)
        .fetch_optional(&self.pool)
        .await
        .map_err(query("read a seed"))?;
        Ok(row.map(|r| SeedInfo {
            hash: hash.clone(),
            engine: r.get("engine"),
            size: r.get::<i32, _>("size_bytes").max(0) as u64,
            head: r.get("head"),
        }))
    }

    async fn seed_chunk(
        &self,
        hash: &SeedHash,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        // A slice of the value: with the column stored uncompressed
        // (migration seed_storage), Postgres reads only the pages it needs.
        // Seeds are at most 16 MiB: past what an int holds is past the end.
        let from = i32::try_from(offset.saturating_add(1)).unwrap_or(i32::MAX);
        let len = i32::try_from(len).unwrap_or(i32::MAX);
        sqlx::query_scalar(
            "SELECT substring(content FROM $2 FOR $3) FROM sandbox_seeds WHERE hash = $1 LIMIT 1",
        )
        .bind(hash.as_str())
        .bind(from)
        .bind(len)
        .fetch_optional(&self.pool)
        .await
        .map_err(query("read a seed's content"))
    }

    async fn record_claim(&self, claim: &PoolClaim, term: Term) -> Result<(), StoreError> {
        let features: Vec<&str> = claim.features.iter().map(String::as_str).collect();
        sqlx::query(
            "INSERT INTO sandbox_pool_claims
                 (container, sandbox_id, engine, generation, incarnation, owner, features, instance, leader_term, seed)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (container) DO UPDATE
                 SET sandbox_id = EXCLUDED.sandbox_id, engine = EXCLUDED.engine,
                     generation = EXCLUDED.generation, incarnation = EXCLUDED.incarnation,
                     owner = EXCLUDED.owner, features = EXCLUDED.features,
                     instance = EXCLUDED.instance, seed = EXCLUDED.seed, claimed_at = now(),
                     leader_term = EXCLUDED.leader_term",
        )
        .bind(claim.container.as_str())
        .bind(claim.sandbox.as_str())
        .bind(&claim.engine)
        .bind(claim.generation)
        .bind(&claim.incarnation)
        .bind(&claim.owner)
        .bind(&features)
        .bind(&claim.instance)
        .bind(term.0)
        .bind(claim.seed.as_ref().map(SeedHash::as_str))
        .execute(&self.pool)
        .await
        .map_err(fenced(term, "record a pool claim"))?;
        Ok(())
    }

    async fn delete_claim(&self, container: &ContainerId, term: Term) -> Result<(), StoreError> {
        // As delete_status: a delete fires no row trigger that could see
        // the term, so the statement checks the lease itself.
        let valid: bool = sqlx::query_scalar(
            "WITH lease AS (SELECT sandbox_lease_valid($2) AS valid),
                  gone AS (DELETE FROM sandbox_pool_claims WHERE container = $1 AND (SELECT valid FROM lease))
             SELECT valid FROM lease",
        )
        .bind(container.as_str())
        .bind(term.0)
        .fetch_one(&self.pool)
        .await
        .map_err(query("delete a pool claim"))?;
        if valid {
            Ok(())
        } else {
            Err(StoreError::Fenced { term })
        }
    }

    async fn record_events(
        &self,
        batch: EventBatch<'_>,
        term: Term,
    ) -> Result<Vec<crate::domain::notice::EventNotice>, StoreError> {
        if batch.events.is_empty() {
            return Ok(Vec::new());
        }
        let events: Vec<serde_json::Value> = batch
            .events
            .iter()
            .map(|e| {
                serde_json::json!({
                    "reason": e.reason.as_str(),
                    "engine": e.engine,
                    "detail": e.detail,
                    "message": e.message,
                })
            })
            .collect();
        // The function (sql/functions/sandbox_record_events.sql) announces each event on NOTIFY
        // sandbox_events and returns them in full.
        let notices: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT sandbox_record_events($1, $2, $3::uuid, $4, $5, $6)")
                .bind(term.0)
                .bind(batch.sandbox.as_str())
                .bind(batch.incarnation.map(Incarnation::as_str))
                .bind(batch.owner)
                .bind(serde_json::Value::Array(events))
                .bind(i32::try_from(batch.keep).unwrap_or(i32::MAX))
                .fetch_one(&self.pool)
                .await
                .map_err(fenced(term, "record events"))?;
        // The events are recorded (and announced) whatever comes back: a
        // notice that does not parse is only missing from the webhook.
        match serde_json::from_value(notices.unwrap_or_else(|| serde_json::json!([]))) {
            Ok(notices) => Ok(notices),
            Err(e) => {
                tracing::warn!(sandbox = %batch.sandbox, error = %e,
                    "sandbox_record_events returned notices this sandboxd cannot read; the webhook does not get them (is the state database's schema newer?)");
                Ok(Vec::new())
            }
        }
    }

    async fn owner_quota(
        &self,
        owner: &str,
    ) -> Result<crate::domain::admission::Quota, StoreError> {
        let row: Option<(Option<i32>, Option<i64>)> =
            sqlx::query_as("SELECT max_sandboxes, max_memory_bytes FROM sandbox_quota_for($1)")
                .bind(owner)
                .fetch_optional(&self.pool)
                .await
                .map_err(query("read an owner's quota"))?;
        let (sandboxes, memory) = row.unwrap_or_default();
        // The table's checks keep both non-negative.
        Ok(crate::domain::admission::Quota {
            sandboxes: sandboxes.map(|n| u64::try_from(n).unwrap_or(0)),
            memory_bytes: memory.map(|n| u64::try_from(n).unwrap_or(0)),
        })
    }

    async fn prune_events(&self, age: Duration) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM sandbox_events WHERE last_at < now() - $1 * interval '1 millisecond'",
        )
        .bind(millis(age))
        .execute(&self.pool)
        .await
        .map_err(query("prune events"))?;
        Ok(done.rows_affected())
    }

    async fn prune_seeds(&self, unnamed_for: Duration) -> Result<u64, StoreError> {
        let pruned: i64 =
            sqlx::query_scalar("SELECT sandbox_seeds_prune($1 * interval '1 millisecond')")
                .bind(millis(unnamed_for))
                .fetch_one(&self.pool)
                .await
                .map_err(query("prune seeds"))?;
        Ok(u64::try_from(pruned).unwrap_or(0))
    }

    async fn checkpoint_work(&self, id: &SandboxId) -> Result<Work, StoreError> {
        // Text forms that always decode; a malformed incarnation or
        // instance map reads as none (the request then fails, never panics).
        let checkpoints = sqlx::query(
            "SELECT name, request, incarnation::text AS incarnation, state, instances::text AS instances, size_bytes
             FROM sandbox_checkpoints WHERE sandbox_id = $1 ORDER BY request",
        )
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(query("read checkpoints"))?
        .into_iter()
        .map(|row| Checkpoint {
            name: row.get("name"),
            request: row.get("request"),
            incarnation: row
                .get::<Option<String>, _>("incarnation")
                .and_then(|t| Incarnation::parse(&t).ok()),
            state: row.get("state"),
            instances: serde_json::from_str(row.get::<&str, _>("instances")).unwrap_or_default(),
            size_bytes: row
                .get::<Option<i64>, _>("size_bytes")
                .and_then(|n| u64::try_from(n).ok()),
        })
        .collect();
        let resets = sqlx::query(
            "SELECT request, checkpoint, incarnation::text AS incarnation
             FROM sandbox_resets WHERE sandbox_id = $1 AND state = 'requested' ORDER BY request",
        )
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(query("read reset requests"))?
        .into_iter()
        .map(|row| Reset {
            request: row.get("request"),
            checkpoint: row.get("checkpoint"),
            incarnation: row
                .get::<Option<String>, _>("incarnation")
                .and_then(|t| Incarnation::parse(&t).ok()),
        })
        .collect();
        Ok(Work {
            checkpoints,
            resets,
        })
    }

    async fn pending_work(&self) -> Result<Vec<SandboxId>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT sandbox_id FROM sandbox_checkpoints WHERE state = 'requested'
             UNION
             SELECT sandbox_id FROM sandbox_resets WHERE state = 'requested'",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(query("list pending checkpoints and resets"))?;
        // An id no row could hold names no sandbox to reconcile.
        Ok(ids
            .iter()
            .filter_map(|id| SandboxId::parse(id).ok())
            .collect())
    }

    async fn notify_queue(&self) -> Result<crate::ports::store::NotifyQueue, StoreError> {
        let (usage, skipped): (f64, i64) = sqlx::query_as(
            "SELECT pg_notification_queue_usage(),
                    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM sandbox_notify_skipped)",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(query("read the notification queue"))?;
        Ok(crate::ports::store::NotifyQueue { usage, skipped })
    }

    async fn finish_checkpoint(
        &self,
        id: &SandboxId,
        name: &str,
        request: i64,
        outcome: &Outcome,
        term: Term,
    ) -> Result<(), StoreError> {
        let (state, message, size, instances) = match outcome {
            Outcome::Ready {
                size_bytes,
                instances,
            } => (
                "ready",
                String::new(),
                Some(i64::try_from(*size_bytes).unwrap_or(i64::MAX)),
                serde_json::to_value(instances).unwrap_or_default(),
            ),
            Outcome::Failed(why) => (
                "failed",
                crate::domain::event::scrub(why, []),
                None,
                serde_json::json!({}),
            ),
        };
        let valid: bool = sqlx::query_scalar(
            "WITH lease AS (SELECT sandbox_lease_valid($6) AS valid),
                  done AS (UPDATE sandbox_checkpoints
                           SET state = $4, message = $5, size_bytes = $7, instances = $8, done_at = now()
                           WHERE sandbox_id = $1 AND name = $2 AND request = $3
                             AND (SELECT valid FROM lease))
             SELECT valid FROM lease",
        )
        .bind(id.as_str())
        .bind(name)
        .bind(request)
        .bind(state)
        .bind(message)
        .bind(term.0)
        .bind(size)
        .bind(instances)
        .fetch_one(&self.pool)
        .await
        .map_err(query("record a checkpoint's outcome"))?;
        if valid {
            Ok(())
        } else {
            Err(StoreError::Fenced { term })
        }
    }

    async fn finish_reset(
        &self,
        request: i64,
        outcome: Result<(), &str>,
        term: Term,
    ) -> Result<(), StoreError> {
        let (state, message) = match outcome {
            Ok(()) => ("done", String::new()),
            Err(why) => ("failed", crate::domain::event::scrub(why, [])),
        };
        let valid: bool = sqlx::query_scalar(
            "WITH lease AS (SELECT sandbox_lease_valid($4) AS valid),
                  done AS (UPDATE sandbox_resets SET state = $2, message = $3, done_at = now()
                           WHERE request = $1 AND state = 'requested' AND (SELECT valid FROM lease))
             SELECT valid FROM lease",
        )
        .bind(request)
        .bind(state)
        .bind(message)
        .bind(term.0)
        .fetch_one(&self.pool)
        .await
        .map_err(query("record a reset's outcome"))?;
        if valid {
            Ok(())
        } else {
            Err(StoreError::Fenced { term })
        }
    }

    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<Option<Term>, StoreError> {
        let term: Option<i64> = sqlx::query_scalar("SELECT sandbox_lease_acquire($1, $2)")
            .bind(holder)
            .bind(millis(duration))
            .fetch_one(&self.pool)
            .await
            .map_err(query("acquire the leader lease"))?;
        Ok(term.map(Term))
    }

    async fn renew_lease(
        &self,
        holder: &str,
        term: Term,
        duration: Duration,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar("SELECT sandbox_lease_renew($1, $2, $3)")
            .bind(holder)
            .bind(term.0)
            .bind(millis(duration))
            .fetch_one(&self.pool)
            .await
            .map_err(query("renew the leader lease"))
    }

    async fn release_lease(&self, holder: &str, term: Term) -> Result<(), StoreError> {
        sqlx::query("SELECT sandbox_lease_release($1, $2)")
            .bind(holder)
            .bind(term.0)
            .execute(&self.pool)
            .await
            .map_err(query("release the leader lease"))?;
        Ok(())
    }

    async fn lease(&self) -> Result<Option<LeaseHolder>, StoreError> {
        let row = sqlx::query("SELECT holder, term, expires_at FROM sandbox_leader")
            .fetch_optional(&self.pool)
            .await
            .map_err(query("read the leader lease"))?;
        Ok(row.map(|r| LeaseHolder {
            holder: r.get("holder"),
            term: Term(r.get("term")),
            expires_at: r.get("expires_at"),
        }))
    }

    async fn watch_desired(&self) -> Result<NotifyStream, StoreError> {
        notify::desired_rows(&self.pool).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_must_fit_postgres_names() {
        assert!(check_role_name("agents").is_ok());
        assert!(check_role_name(&"r".repeat(63)).is_ok());
        for bad in ["", "a\nb", &"r".repeat(64)] {
            assert!(
                matches!(check_role_name(bad), Err(RoleError::InvalidName(_))),
                "{bad:?}"
            );
        }
    }
}
