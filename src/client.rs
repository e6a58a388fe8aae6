//! The Rust API for orchestrators: ask for a sandbox (declaratively with
//! [`Client::apply`], or additively with [`Client::request`]), wait for it
//! to be ready, touch it, release it. Other languages use the same contract
//! in plain SQL (see docs/contract.md).

use crate::adapters::postgres::{self, PgStore, STATUS_CHANNEL};
use crate::domain::event::RecordedEvent;
use crate::domain::id::SandboxId;
use crate::domain::identity::Incarnation;
use crate::domain::isolation::Isolation;
use crate::domain::sandbox::{DesiredSandbox, IdleAction, Phase, SandboxStatus};
use crate::ports::store::{Store, StoreError, NOTIFY_EVERY_ROW};
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
    /// The row was deleted (or deleted and inserted again) while waiting.
    #[error("sandbox {id} was released while waiting (its row is gone, or was deleted and created again as another incarnation): request it again and wait for that")]
    Released {
        /// Sandbox id.
        id: SandboxId,
    },
    /// The database refused a checkpoint or reset (an invalid or reserved
    /// name, an unknown sandbox or checkpoint, too many checkpoints): the
    /// message says what to do.
    #[error("{0}")]
    Refused(String),
    /// sandboxd could not perform a checkpoint or reset.
    #[error("{what} {name} of sandbox {id} failed: {message}")]
    CheckpointFailed {
        /// Sandbox id.
        id: SandboxId,
        /// `checkpoint` or `reset`.
        what: &'static str,
        /// The checkpoint's name.
        name: String,
        /// sandboxd's message.
        message: String,
    },
    /// sandboxd did not perform a checkpoint or reset in time.
    #[error("{what} {name} of sandbox {id} was not done within {timeout:?}; is sandboxd running and the sandbox ready? see `sandboxd describe {id}`")]
    CheckpointTimeout {
        /// Sandbox id.
        id: SandboxId,
        /// `checkpoint` or `reset`.
        what: &'static str,
        /// The checkpoint's name.
        name: String,
        /// How long the client waited.
        timeout: Duration,
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

/// What an orchestrator asks for with [`Client::apply`]: the whole desired
/// state, replacing what the row asked before.
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
    /// Released once unused (neither requested nor touched) this long;
    /// zero: never; `None`: the controller's `--idle-timeout`. At most 365
    /// days; whole microseconds (finer parts are dropped).
    pub idle_timeout: Option<Duration>,
    /// Data on a named Docker volume instead of tmpfs; never idle-released
    /// or expired. Fixed once the row exists: release it to change this.
    pub persistent: bool,
    /// The agent's Docker container: when it is gone the controller
    /// releases the sandbox.
    pub owner_container: Option<String>,
    /// What the sandbox becomes once idle: released (the default) or
    /// paused (frozen with its data; a request or touch resumes it).
    pub idle_action: IdleAction,
    /// The isolation level its engines run under: `Gvisor` puts them
    /// behind gVisor's user-space kernel; `None`: the controller's
    /// `--runtime` (which a row can raise, never lower). A change
    /// re-provisions with fresh credentials.
    pub isolation: Option<Isolation>,
    /// The seed each engine starts with, by engine: hashes
    /// [`Client::put_seed`] returned for this owner. A change
    /// re-provisions with fresh credentials.
    pub seeds: BTreeMap<String, String>,
}

/// What an orchestrator adds to a sandbox with [`Client::request`]
/// (`sandbox_request`): the row is created if absent; otherwise services,
/// features and attach are added to what it asks (nothing is removed),
/// `idle_timeout` and `owner_container` replace the row's only when given,
/// and `owner` and `persistent`, when given, must equal the row's.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Who asks; `None`: the row's owner, or for a new row the database
    /// role the client connects as.
    pub owner: Option<String>,
    /// Engines to add: postgres, redis, valkey, mongo.
    pub services: Vec<String>,
    /// Features to add, per engine.
    pub features: BTreeMap<String, BTreeSet<String>>,
    /// Released once unused this long; zero: never. `None` keeps the row's
    /// (for a new row: the controller's `--idle-timeout`).
    pub idle_timeout: Option<Duration>,
    /// Whether the data lives on a Docker volume; `None` keeps the row's
    /// (for a new row: not persistent).
    pub persistent: Option<bool>,
    /// The agent's Docker container; `None` keeps the row's.
    pub owner_container: Option<String>,
    /// Docker containers to add to those connected to the sandbox's network.
    pub attach: Vec<String>,
    /// What the sandbox becomes once idle; `None` keeps the row's (for a
    /// new row: released).
    pub idle_action: Option<IdleAction>,
    /// The isolation level; `None` keeps the row's (for a new row: the
    /// controller's `--runtime`).
    pub isolation: Option<Isolation>,
    /// Seeds to set, by engine (replacing the row's for those engines).
    pub seeds: BTreeMap<String, String>,
}

/// `d` in whole microseconds, the precision of a Postgres `interval`.
fn micros(d: Duration) -> Duration {
    // Past i64::MAX microseconds sqlx cannot encode it; the database
    // refuses anything over 365 days with a message anyway.
    Duration::from_micros(
        u64::try_from(d.as_micros()).map_or(i64::MAX as u64, |m| m.min(i64::MAX as u64)),
    )
}

/// Maps a database error: refusals by the contract's checks (SQLSTATE
/// 23514) and by row-level security or privileges (42501) carry a message
/// that says what to do, and are shown as is.
/// The revision a verb that wrote row `id` at `generation` in `tx` returns:
/// its incarnation is read in the same transaction (the row stays locked
/// from the write until then, so no delete and insert can come between),
/// then `tx` commits.
async fn committed(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    id: &SandboxId,
    generation: i64,
    op: &'static str,
) -> Result<Revision, ClientError> {
    let incarnation: String =
        sqlx::query_scalar("SELECT incarnation::text FROM sandbox_desired WHERE id = $1")
            .bind(id.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(query("read the written row"))?;
    tx.commit().await.map_err(query(op))?;
    Ok(Revision::read(id, generation, &incarnation)?)
}

fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| match &source {
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("23514" | "42501")) => {
            StoreError::Rejected(db.message().to_owned())
        }
        _ => StoreError::Query {
            op,
            source: Box::new(source),
        },
    }
}

/// What a write of a desired row returns and a waiter waits for: the
/// row's incarnation (set by the database when the row was inserted) and
/// the generation the write made (or found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// `sandbox_desired.generation` after the write.
    pub generation: i64,
    /// `sandbox_desired.incarnation`: which life of the id this row is.
    pub incarnation: Incarnation,
}

impl Revision {
    fn read(id: &SandboxId, generation: i64, incarnation: &str) -> Result<Self, StoreError> {
        Ok(Self {
            generation,
            incarnation: incarnation_of(id, incarnation)?,
        })
    }
}

/// The incarnation `text` read from `id`'s desired row.
fn incarnation_of(id: &SandboxId, text: &str) -> Result<Incarnation, StoreError> {
    Incarnation::parse(text).map_err(|e| StoreError::Malformed {
        table: "sandbox_desired",
        id: id.to_string(),
        reason: e.to_string(),
    })
}

/// What a status says to a client waiting for `revision`: ready (the
/// status), failed (an error), or not yet (`None`). Only a status of the
/// row's incarnation that observed its generation counts: one of an
/// earlier incarnation of the id (deleted and inserted again) carries
/// another sandbox's credentials.
fn settled(
    status: &SandboxStatus,
    revision: &Revision,
) -> Option<Result<SandboxStatus, ClientError>> {
    if !is_of(status, revision) {
        return None;
    }
    match status.phase {
        Phase::Ready => Some(Ok(status.clone())),
        Phase::Failed => Some(Err(ClientError::Failed {
            id: status.id.clone(),
            message: status.message.clone(),
        })),
        // A paused sandbox is resumed by the request being waited for.
        Phase::Pending
        | Phase::Provisioning
        | Phase::Healing
        | Phase::Terminating
        | Phase::Paused => None,
    }
}

/// Whether `status` is about `revision`: its incarnation, its generation
/// or a later one.
fn is_of(status: &SandboxStatus, revision: &Revision) -> bool {
    status.incarnation.as_ref() == Some(&revision.incarnation)
        && status.observed_generation >= revision.generation
}

/// The phase (and message) a waiter for `revision` reports from `status`:
/// the status's own while it is of the revision, or working towards it
/// (a status keeps its observed generation until provisioning is done);
/// `pending` for another incarnation's, or for a verdict (ready, failed)
/// about an earlier generation.
fn progress_of(status: &SandboxStatus, revision: &Revision) -> (Phase, String) {
    let ours = status.incarnation.as_ref() == Some(&revision.incarnation);
    let current = status.observed_generation >= revision.generation;
    let verdict = matches!(status.phase, Phase::Ready | Phase::Failed);
    if ours && (current || !verdict) {
        (status.phase, status.message.clone())
    } else {
        (Phase::Pending, String::new())
    }
}

/// What a waiter saw: the phase of the status of the revision it waits for
/// (`pending` until there is one) and its message.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// Since the wait began.
    pub elapsed: Duration,
    /// The phase.
    pub phase: Phase,
    /// Why (empty when ready).
    pub message: &'a str,
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
            store: PgStore::connect(database_url, 4, crate::engine::REGISTRY).await?,
        })
    }

    /// Uses an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            store: PgStore::with_engines(pool, crate::engine::REGISTRY),
        }
    }

    /// Writes (inserts or replaces) the desired row, the declarative upsert;
    /// returns its incarnation and generation to wait for. An unchanged row
    /// keeps its generation (and only records a use, like
    /// [`Client::touch`]); an existing row keeps its incarnation.
    pub async fn apply(
        &self,
        id: &SandboxId,
        req: &SandboxRequest,
    ) -> Result<Revision, ClientError> {
        let features = serde_json::json!(req.features);
        let (generation, incarnation): (i64, String) = sqlx::query_as(
            "INSERT INTO sandbox_desired (id, owner, services, features, attach, expires_at,
                                          idle_timeout, persistent, owner_container, idle_action,
                                          isolation, seeds)
             VALUES ($1, coalesce(nullif($2, ''), current_user), $3, $4, $5, $6, $7, $8, $9, $10,
                     $11, $12)
             ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, services = EXCLUDED.services,
                 features = EXCLUDED.features, attach = EXCLUDED.attach,
                 expires_at = EXCLUDED.expires_at, idle_timeout = EXCLUDED.idle_timeout,
                 persistent = EXCLUDED.persistent, owner_container = EXCLUDED.owner_container,
                 idle_action = EXCLUDED.idle_action, isolation = EXCLUDED.isolation,
                 seeds = EXCLUDED.seeds, last_used_at = now()
             RETURNING generation, incarnation::text",
        )
        .bind(id.as_str())
        .bind(&req.owner)
        .bind(&req.services)
        .bind(features)
        .bind(&req.attach)
        .bind(req.expires_at)
        .bind(req.idle_timeout.map(micros))
        .bind(req.persistent)
        .bind(&req.owner_container)
        .bind(req.idle_action.as_str())
        .bind(req.isolation.map(Isolation::as_str))
        .bind(serde_json::json!(req.seeds))
        .fetch_one(self.store.pool())
        .await
        .map_err(query("write desired row"))?;
        Ok(Revision::read(id, generation, &incarnation)?)
    }

    /// Adds to the sandbox, creating it if absent (`sandbox_request`, the
    /// additive verb); returns its incarnation and the generation to wait
    /// for. Every call makes a new generation, so a sandbox that failed is
    /// retried at once.
    pub async fn request(&self, id: &SandboxId, req: &Request) -> Result<Revision, ClientError> {
        let features = serde_json::json!(req.features);
        // One transaction: the row stays locked from the request until its
        // incarnation is read, so no delete and insert can come between.
        let mut tx = self
            .store
            .pool()
            .begin()
            .await
            .map_err(query("request sandbox"))?;
        let generation: i64 = sqlx::query_scalar(
            "SELECT sandbox_request($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(id.as_str())
        .bind(&req.owner)
        .bind(&req.services)
        .bind(features)
        .bind(req.idle_timeout.map(micros))
        .bind(req.persistent)
        .bind(&req.owner_container)
        .bind(&req.attach)
        .bind(req.idle_action.map(IdleAction::as_str))
        .bind(req.isolation.map(Isolation::as_str))
        .bind((!req.seeds.is_empty()).then(|| serde_json::json!(req.seeds)))
        .fetch_one(&mut *tx)
        .await
        .map_err(query("request sandbox"))?;
        committed(tx, id, generation, "request sandbox").await
    }

    /// Forks `source` into a new sandbox `id` (`sandbox_fork`): the same
    /// services, features and isolation, its engines starting with a copy
    /// of the source's data as it is when sandboxd takes it, under fresh
    /// credentials. Returns the revision to wait for. `owner`, when given,
    /// must be the source's. A source this role cannot see is not found;
    /// forking again into the same `id` from the same source returns the
    /// fork's revision.
    pub async fn fork(
        &self,
        source: &SandboxId,
        id: &SandboxId,
        owner: Option<&str>,
    ) -> Result<Revision, ClientError> {
        let mut tx = self
            .store
            .pool()
            .begin()
            .await
            .map_err(query("fork sandbox"))?;
        let generation: i64 = sqlx::query_scalar("SELECT sandbox_fork($1, $2, $3)")
            .bind(source.as_str())
            .bind(id.as_str())
            .bind(owner)
            .fetch_one(&mut *tx)
            .await
            .map_err(query("fork sandbox"))?;
        committed(tx, id, generation, "fork sandbox").await
    }

    /// Records a use of the sandbox (`sandbox_touch`): its idle timeout
    /// starts again; no new generation. False when there is no such
    /// sandbox, it expired, or it is being released: request it again.
    pub async fn touch(&self, id: &SandboxId) -> Result<bool, ClientError> {
        Ok(sqlx::query_scalar("SELECT sandbox_touch($1)")
            .bind(id.as_str())
            .fetch_one(self.store.pool())
            .await
            .map_err(query("touch sandbox"))?)
    }

    /// Resumes a paused sandbox: touches it (which wakes sandboxd, see
    /// `sandbox_touch`) and waits up to `timeout` until its status is no
    /// longer `paused`, which it returns (a sandbox that was not paused
    /// returns at once). `None` when the touch found nothing to touch (not
    /// desired, expired or being released).
    pub async fn resume(
        &self,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<Option<SandboxStatus>, ClientError> {
        if !self.touch(id).await? {
            return Ok(None);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self.status(id).await?;
            match status {
                Some(s) if s.phase != Phase::Paused => return Ok(Some(s)),
                _ if tokio::time::Instant::now() >= deadline => {
                    return Err(ClientError::Timeout {
                        id: id.clone(),
                        timeout,
                        phase: status.map_or("none".into(), |s| s.phase.to_string()),
                    })
                }
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// Waits until the status is of `revision`'s incarnation, reflects its
    /// generation and is ready (returned) or failed (an error), or `timeout`
    /// passes. A status of another incarnation of the id is never accepted;
    /// a row released meanwhile ends the wait with
    /// [`ClientError::Released`].
    pub async fn wait_ready(
        &self,
        id: &SandboxId,
        revision: &Revision,
        timeout: Duration,
    ) -> Result<SandboxStatus, ClientError> {
        self.wait_ready_watching(id, revision, timeout, |_| {})
            .await
    }

    /// [`Client::wait_ready`], telling `watch` each phase (and message) the
    /// sandbox goes through as it is seen, the first one included. Until
    /// sandboxd has written a status of `revision`, the phase is `pending`.
    pub async fn wait_ready_watching(
        &self,
        id: &SandboxId,
        revision: &Revision,
        timeout: Duration,
        mut watch: impl FnMut(Progress<'_>),
    ) -> Result<SandboxStatus, ClientError> {
        // The listener has its own connection, outside the pool: waiters
        // must not starve the pool they read their status with.
        let mut listener = postgres::listen(self.store.pool(), &[STATUS_CHANNEL]).await?;
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        let mut last_phase = "none".to_owned();
        let mut shown: Option<(Phase, String)> = None;
        loop {
            // Check after subscribing, and after every wake-up or tick: a
            // NOTIFY lost to a reconnect costs at most one tick.
            let status = self.store.fetch_status(id).await?;
            let seen = status
                .as_ref()
                .map(|s| progress_of(s, revision))
                .unwrap_or((Phase::Pending, String::new()));
            if shown.as_ref() != Some(&seen) {
                watch(Progress {
                    elapsed: started.elapsed(),
                    phase: seen.0,
                    message: &seen.1,
                });
                shown = Some(seen);
            }
            if let Some(s) = status {
                last_phase = s.phase.to_string();
                if let Some(outcome) = settled(&s, revision) {
                    return outcome;
                }
            }
            if self.incarnation(id).await?.as_ref() != Some(&revision.incarnation) {
                return Err(ClientError::Released { id: id.clone() });
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
            // A change of a status of this incarnation (the payload names
            // it, never the id: any role may listen), or of every status (a
            // TRUNCATE), or a one-second tick, which also covers NOTIFYs
            // lost to a reconnect, triggers a re-check.
            let wake = async {
                loop {
                    match listener.try_recv().await {
                        Ok(Some(n))
                            if n.payload() != revision.incarnation.as_str()
                                && n.payload() != NOTIFY_EVERY_ROW =>
                        {
                            continue
                        }
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
        let revision = self.apply(id, req).await?;
        self.wait_ready(id, &revision, timeout).await
    }

    /// Requests (see [`Client::request`]) and waits for the sandbox to be
    /// ready at the returned incarnation and generation.
    pub async fn request_and_wait(
        &self,
        id: &SandboxId,
        req: &Request,
        timeout: Duration,
    ) -> Result<SandboxStatus, ClientError> {
        let revision = self.request(id, req).await?;
        self.wait_ready(id, &revision, timeout).await
    }

    /// Deletes the desired row (`sandbox_release`); sandboxd tears the
    /// containers down. True if the row existed.
    pub async fn release(&self, id: &SandboxId) -> Result<bool, ClientError> {
        Ok(sqlx::query_scalar("SELECT sandbox_release($1)")
            .bind(id.as_str())
            .fetch_one(self.store.pool())
            .await
            .map_err(query("release sandbox"))?)
    }

    /// The incarnation of the sandbox's desired row, if it exists.
    pub async fn incarnation(&self, id: &SandboxId) -> Result<Option<Incarnation>, ClientError> {
        let text: Option<String> =
            sqlx::query_scalar("SELECT incarnation::text FROM sandbox_desired WHERE id = $1")
                .bind(id.as_str())
                .fetch_optional(self.store.pool())
                .await
                .map_err(query("read desired row"))?;
        Ok(text.map(|t| incarnation_of(id, &t)).transpose()?)
    }

    /// The current status, if any.
    pub async fn status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, ClientError> {
        Ok(self.store.fetch_status(id).await?)
    }

    /// Every status row.
    pub async fn list(&self) -> Result<Vec<SandboxStatus>, ClientError> {
        Ok(self.store.list_status().await?)
    }

    /// Every status row without its secrets (each engine's password, url
    /// and env blanked in the database), for an overview of the fleet.
    pub async fn list_redacted(&self) -> Result<Vec<SandboxStatus>, ClientError> {
        Ok(self.store.list_status_redacted().await?)
    }

    /// The desired row, if it exists (and the connecting role may see it).
    pub async fn desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, ClientError> {
        Ok(self.store.fetch_desired(id).await?)
    }

    /// What `list` and `describe` show of each desired row the connecting
    /// role may see, by id.
    pub async fn rows(&self) -> Result<BTreeMap<String, RowSummary>, ClientError> {
        self.row_summaries(None).await
    }

    /// Every sandbox the connecting role may see, as `sandboxd list` shows
    /// them (no secrets), sorted by id.
    pub async fn summaries(&self) -> Result<Vec<SandboxSummary>, ClientError> {
        let (statuses, rows) = tokio::try_join!(self.list_redacted(), self.rows())?;
        Ok(summaries(statuses, rows))
    }

    /// [`Client::rows`] of one sandbox.
    pub async fn row(&self, id: &SandboxId) -> Result<Option<RowSummary>, ClientError> {
        Ok(self.row_summaries(Some(id)).await?.into_values().next())
    }

    async fn row_summaries(
        &self,
        id: Option<&SandboxId>,
    ) -> Result<BTreeMap<String, RowSummary>, ClientError> {
        // id, generation, created_at, services, owner
        type Row = (String, i64, DateTime<Utc>, Vec<String>, String);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, generation, created_at, services, owner FROM sandbox_desired
              WHERE $1::text IS NULL OR id = $1",
        )
        .bind(id.map(SandboxId::as_str))
        .fetch_all(self.store.pool())
        .await
        .map_err(query("read desired rows"))?;
        Ok(rows
            .into_iter()
            .map(|(id, generation, created_at, services, owner)| {
                let summary = RowSummary {
                    generation,
                    created_at,
                    services,
                    owner,
                };
                (id, summary)
            })
            .collect())
    }

    /// Registers seed `content` for `engine` (`sandbox_seed_put`) as
    /// `owner`'s (`None`: the role the client connects as; rows may name
    /// only their owner's seeds), and returns its hash (`sha256:…`) to name
    /// in a row's `seeds`; the same content again is the same hash.
    /// Refused (with the database's message) for an engine that takes no
    /// seeds, empty content, more than 16 MiB, or an owner whose rows this
    /// role may not write.
    pub async fn put_seed(
        &self,
        engine: &str,
        content: &[u8],
        owner: Option<&str>,
    ) -> Result<String, ClientError> {
        sqlx::query_scalar("SELECT sandbox_seed_put($1, $2, $3)")
            .bind(engine)
            .bind(content)
            .bind(owner)
            .fetch_one(self.store.pool())
            .await
            .map_err(refused("register a seed"))
    }

    /// Deletes seed `hash` of `owner` (`sandbox_seed_delete`; `None`: the
    /// role the client connects as): whether there was one. Refused (with
    /// the database's message) while a row of that owner names it, or for
    /// an owner whose rows this role may not write.
    pub async fn delete_seed(&self, hash: &str, owner: Option<&str>) -> Result<bool, ClientError> {
        sqlx::query_scalar("SELECT sandbox_seed_delete($1, $2)")
            .bind(hash)
            .bind(owner)
            .fetch_one(self.store.pool())
            .await
            .map_err(refused("delete a seed"))
    }

    /// Asks for checkpoint `name` of the sandbox (its data now, all engines;
    /// one of that name is replaced): the request's number. Refused when
    /// the name is invalid or `baseline`, the sandbox is not one this role
    /// sees, or it has the most checkpoints it may.
    pub async fn request_checkpoint(&self, id: &SandboxId, name: &str) -> Result<i64, ClientError> {
        sqlx::query_scalar("SELECT sandbox_checkpoint($1, $2)")
            .bind(id.as_str())
            .bind(name)
            .fetch_one(self.store.pool())
            .await
            .map_err(refused("ask for a checkpoint"))
    }

    /// Asks for the sandbox's data to go back to checkpoint `name` (`None`:
    /// the baseline, the empty database with its features) with the same
    /// credentials (`sandbox_reset`): the request's number.
    pub async fn request_reset(
        &self,
        id: &SandboxId,
        name: Option<&str>,
    ) -> Result<i64, ClientError> {
        sqlx::query_scalar("SELECT sandbox_reset($1, $2)")
            .bind(id.as_str())
            .bind(name)
            .fetch_one(self.store.pool())
            .await
            .map_err(refused("ask for a reset"))
    }

    /// Takes checkpoint `name` and waits until sandboxd recorded it: its
    /// row. Fails with what sandboxd said, or after `timeout`.
    pub async fn checkpoint(
        &self,
        id: &SandboxId,
        name: &str,
        timeout: Duration,
    ) -> Result<CheckpointInfo, ClientError> {
        let request = self.request_checkpoint(id, name).await?;
        let failed = |message: String| ClientError::CheckpointFailed {
            id: id.clone(),
            what: "checkpoint",
            name: name.to_owned(),
            message,
        };
        let done = poll_outcome(timeout, || async {
            let row = self
                .checkpoints(id)
                .await?
                .into_iter()
                .find(|c| c.name == name);
            match row {
                Some(c) if c.request == request && c.state == "ready" => Ok(Some(c)),
                Some(c) if c.request == request && c.state == "failed" => Err(failed(c.message)),
                Some(c) if c.request == request => Ok(None),
                // Taken again (or the sandbox released) meanwhile.
                _ => Err(failed(
                    "it was asked again, or the sandbox was released, while waiting".to_owned(),
                )),
            }
        })
        .await?;
        done.ok_or_else(|| ClientError::CheckpointTimeout {
            id: id.clone(),
            what: "checkpoint",
            name: name.to_owned(),
            timeout,
        })
    }

    /// Resets the sandbox's data to checkpoint `name` (`None`: the
    /// baseline) and waits until sandboxd did. Fails with what sandboxd
    /// said, or after `timeout`.
    pub async fn reset(
        &self,
        id: &SandboxId,
        name: Option<&str>,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let request = self.request_reset(id, name).await?;
        let name = name.unwrap_or(crate::domain::checkpoint::BASELINE);
        let done = poll_outcome(timeout, || async {
            let row: Option<(String, String)> =
                sqlx::query_as("SELECT state, message FROM sandbox_resets WHERE request = $1")
                    .bind(request)
                    .fetch_optional(self.store.pool())
                    .await
                    .map_err(query("read a reset"))?;
            match row {
                Some((state, _)) if state == "done" => Ok(Some(())),
                Some((state, message)) if state == "failed" => Err(ClientError::CheckpointFailed {
                    id: id.clone(),
                    what: "reset",
                    name: name.to_owned(),
                    message,
                }),
                Some(_) => Ok(None),
                None => Err(ClientError::Released { id: id.clone() }),
            }
        })
        .await?;
        done.ok_or_else(|| ClientError::CheckpointTimeout {
            id: id.clone(),
            what: "reset",
            name: name.to_owned(),
            timeout,
        })
    }

    /// The sandbox's checkpoints (those this role may see), by name.
    pub async fn checkpoints(&self, id: &SandboxId) -> Result<Vec<CheckpointInfo>, ClientError> {
        Ok(sqlx::query_as(
            "SELECT name, request, state, message, size_bytes, requested_at, done_at
             FROM sandbox_checkpoints WHERE sandbox_id = $1 ORDER BY name",
        )
        .bind(id.as_str())
        .fetch_all(self.store.pool())
        .await
        .map_err(query("read checkpoints"))?)
    }

    /// The newest `limit` events of the sandbox, oldest first (those the
    /// connecting role may see: an orchestrator sees the events of the
    /// rows it may read).
    pub async fn events(
        &self,
        id: &SandboxId,
        limit: u32,
    ) -> Result<Vec<RecordedEvent>, ClientError> {
        Ok(self.store.events(id, limit).await?)
    }
}

/// Looks at a checkpoint's or reset's outcome every 20 ms until `look`
/// decides (`Some`, or an error), or `timeout` passes (`None`).
async fn poll_outcome<T, F, Fut>(timeout: Duration, mut look: F) -> Result<Option<T>, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(done) = look().await? {
            return Ok(Some(done));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A checkpoint of a sandbox (a row of `sandbox_checkpoints`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct CheckpointInfo {
    /// Its name.
    pub name: String,
    /// The number of its latest request.
    pub request: i64,
    /// `requested`, `ready` or `failed`.
    pub state: String,
    /// Why it failed (empty otherwise).
    pub message: String,
    /// What it takes in the sandbox's memory, once ready.
    pub size_bytes: Option<i64>,
    /// When it was last asked for.
    pub requested_at: DateTime<Utc>,
    /// When sandboxd finished it.
    pub done_at: Option<DateTime<Utc>>,
}

/// Maps the refusals of `sandbox_checkpoint` and `sandbox_reset` (invalid
/// parameter, no such sandbox or checkpoint, too many) to
/// [`ClientError::Refused`].
fn refused(op: &'static str) -> impl FnOnce(sqlx::Error) -> ClientError {
    move |e| match &e {
        sqlx::Error::Database(db)
            if matches!(
                db.code().as_deref(),
                Some("22023" | "P0002" | "54000" | "23514" | "23503" | "0A000" | "42501")
            ) =>
        {
            ClientError::Refused(db.message().to_owned())
        }
        _ => ClientError::Store(query(op)(e)),
    }
}

/// What `sandboxd list` and `describe` show of a desired row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowSummary {
    /// `sandbox_desired.generation`.
    pub generation: i64,
    /// When the row was inserted (this incarnation).
    pub created_at: DateTime<Utc>,
    /// The engines it asks for, as written.
    pub services: Vec<String>,
    /// The owner the row belongs to.
    pub owner: String,
}

/// One line of `sandboxd list` (and of the operator page's list): a
/// sandbox's status joined with its desired row; a row sandboxd has not
/// written a status for yet is `pending`, a status whose row is gone
/// (being released) has no owner, creation time or generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SandboxSummary {
    /// The sandbox id.
    pub id: String,
    /// Its phase.
    pub phase: String,
    /// The row's owner, while the row exists.
    pub owner: Option<String>,
    /// The engines it asks for (or, once its row is gone, those it ran).
    pub engines: Vec<String>,
    /// When the row was inserted.
    pub created_at: Option<DateTime<Utc>>,
    /// The row's generation.
    pub generation: Option<i64>,
    /// The generation the status reflects.
    pub observed_generation: i64,
    /// Heals of all its engines.
    pub heals: u64,
    /// Its network.
    pub network: Option<String>,
    /// The status message.
    pub message: String,
}

/// Joins redacted statuses with desired rows, sorted by id.
fn summaries(
    statuses: Vec<SandboxStatus>,
    mut rows: BTreeMap<String, RowSummary>,
) -> Vec<SandboxSummary> {
    let mut entries: Vec<SandboxSummary> = statuses
        .into_iter()
        .map(|s| {
            let row = rows.remove(s.id.as_str());
            SandboxSummary {
                id: s.id.to_string(),
                phase: s.phase.to_string(),
                engines: match &row {
                    Some(r) => r.services.clone(),
                    None => s.services.keys().cloned().collect(),
                },
                owner: row.as_ref().map(|r| r.owner.clone()),
                created_at: row.as_ref().map(|r| r.created_at),
                generation: row.as_ref().map(|r| r.generation),
                observed_generation: s.observed_generation,
                heals: s.services.values().map(|v| u64::from(v.heals)).sum(),
                network: s.network,
                message: s.message,
            }
        })
        .collect();
    entries.extend(rows.into_iter().map(|(id, row)| SandboxSummary {
        id,
        phase: "pending".into(),
        engines: row.services,
        owner: Some(row.owner),
        created_at: Some(row.created_at),
        generation: Some(row.generation),
        observed_generation: 0,
        heals: 0,
        network: None,
        message: "sandboxd has not written a status yet".into(),
    }));
    entries.sort_by(|a, b| a.id.cmp(&b.id));
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: &str = "0a0b0c0d-0000-4000-8000-000000000002";
    const OLD: &str = "0a0b0c0d-0000-4000-8000-000000000001";

    fn status(phase: Phase, observed_generation: i64) -> SandboxStatus {
        of(NEW, phase, observed_generation)
    }

    fn of(incarnation: &str, phase: Phase, observed_generation: i64) -> SandboxStatus {
        SandboxStatus {
            id: SandboxId::parse("agent-7").unwrap(),
            phase,
            observed_generation,
            message: "why".into(),
            services: BTreeMap::new(),
            updated_at: None,
            network: None,
            incarnation: Incarnation::parse(incarnation).ok(),
        }
    }

    fn at(generation: i64) -> Revision {
        Revision {
            generation,
            incarnation: Incarnation::parse(NEW).unwrap(),
        }
    }

    #[test]
    fn a_waiter_settles_only_on_ready_or_failed_at_its_generation_or_later() {
        assert!(settled(&status(Phase::Ready, 1), &at(2)).is_none());
        assert!(settled(&status(Phase::Failed, 1), &at(2)).is_none());
        assert!(settled(&status(Phase::Provisioning, 2), &at(2)).is_none());
        assert!(settled(&status(Phase::Terminating, 3), &at(2)).is_none());
        assert!(matches!(
            settled(&status(Phase::Ready, 2), &at(2)),
            Some(Ok(_))
        ));
        assert!(matches!(
            settled(&status(Phase::Ready, 3), &at(2)),
            Some(Ok(_))
        ));
        match settled(&status(Phase::Failed, 2), &at(2)) {
            Some(Err(ClientError::Failed { id, message })) => {
                assert_eq!(id.as_str(), "agent-7");
                assert_eq!(message, "why");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_waiter_reports_the_work_towards_its_generation_but_not_an_earlier_verdict() {
        assert_eq!(
            progress_of(&status(Phase::Provisioning, 1), &at(2)).0,
            Phase::Provisioning
        );
        assert_eq!(
            progress_of(&status(Phase::Healing, 1), &at(2)).0,
            Phase::Healing
        );
        assert_eq!(
            progress_of(&status(Phase::Ready, 1), &at(2)).0,
            Phase::Pending
        );
        assert_eq!(
            progress_of(&status(Phase::Failed, 1), &at(2)).0,
            Phase::Pending
        );
        assert_eq!(
            progress_of(&status(Phase::Ready, 2), &at(2)).0,
            Phase::Ready
        );
        assert_eq!(
            progress_of(&of(OLD, Phase::Provisioning, 5), &at(1)).0,
            Phase::Pending
        );
        assert_eq!(progress_of(&status(Phase::Failed, 2), &at(2)).1, "why");
    }

    #[test]
    fn a_waiter_never_accepts_a_status_of_another_incarnation_whatever_its_generation() {
        // The id was deleted and inserted again: the old incarnation's
        // status is further along, and ready, with the old credentials.
        assert!(settled(&of(OLD, Phase::Ready, 7), &at(1)).is_none());
        assert!(settled(&of(OLD, Phase::Failed, 7), &at(1)).is_none());
        let mut before_incarnations = of(NEW, Phase::Ready, 7);
        before_incarnations.incarnation = None;
        assert!(settled(&before_incarnations, &at(1)).is_none());
        assert!(matches!(
            settled(&of(NEW, Phase::Ready, 1), &at(1)),
            Some(Ok(_))
        ));
    }
}
