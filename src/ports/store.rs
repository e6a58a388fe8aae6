//! The state store port: what the controller reads and writes in
//! sandboxd's own database.

use super::BoxError;
use crate::domain::admission::Quota;
use crate::domain::breaker::ReapingState;
use crate::domain::checkpoint::{Outcome, Work};
use crate::domain::event::Event;
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::identity::{Incarnation, StateId};
use crate::domain::lease::{LeaseHolder, Term};
use crate::domain::notice::EventNotice;
use crate::domain::pool::PoolClaim;
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus};
use crate::domain::seed::{SeedHash, SeedInfo};
use crate::domain::status::StatusUpdate;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::time::Duration;

/// The cluster's `NOTIFY` queue as the state database reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NotifyQueue {
    /// `pg_notification_queue_usage()`: the fraction in use, 0 to 1.
    pub usage: f64,
    /// Notifications `sandbox_notify_send` skipped, ever (the sequence
    /// `sandbox_notify_skipped`).
    pub skipped: i64,
}

/// Failures of the state store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached.
    #[error("cannot connect to the state database ({0}); check DATABASE_URL and that Postgres is running")]
    Connect(#[source] BoxError),
    /// Migrations failed.
    #[error(
        "migrating the state database failed ({0}); run `sandboxd migrate` to see the full error"
    )]
    Migrate(#[source] BoxError),
    /// A query failed.
    #[error("state database {op} failed: {source}")]
    Query {
        /// What sandboxd was doing.
        op: &'static str,
        /// The database error.
        #[source]
        source: BoxError,
    },
    /// A query did not answer within its deadline.
    #[error("state database {op} did not answer within {after:?}; is Postgres overloaded, or is a lock held on sandboxd's tables? (pg_stat_activity)")]
    Timeout {
        /// What sandboxd was doing.
        op: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The database rejected a desired row (see the message for what is allowed).
    #[error("{0}")]
    Rejected(String),
    /// The database refused a status write: this process's leader term is
    /// no longer the lease's (another sandboxd took over).
    #[error("state database refused a status write of leader term {term}: another sandboxd holds the lease now (SELECT * FROM sandbox_leader); this one stands by")]
    Fenced {
        /// The refused term.
        term: Term,
    },
    /// The state database has no readable identity.
    #[error("the state database has no identity ({0}): table sandbox_identity must hold the one row its migration created; run `sandboxd migrate` on this database, or restore that row from a backup (a new identity makes every existing container another database's)")]
    NoIdentity(String),
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

/// The payload of a `NOTIFY` on `sandbox_desired` or `sandbox_status` that
/// names no row but says every row may have changed (the table was
/// truncated, or reaping resumed): never a valid sandbox id or incarnation.
pub const NOTIFY_EVERY_ROW: &str = "*";

/// The ids of the sandboxes whose desired rows changed, as the store found
/// them from `NOTIFY sandbox_desired` (whose payloads name rows by
/// incarnation), or [`NOTIFY_EVERY_ROW`] when the owner asked for a relist;
/// the stream ends (or yields an error) when the connection drops.
pub type NotifyStream = BoxStream<'static, Result<String, StoreError>>;

/// A reconcile's events for one sandbox (see [`Store::record_events`]).
#[derive(Debug, Clone, Copy)]
pub struct EventBatch<'a> {
    /// The sandbox.
    pub sandbox: &'a SandboxId,
    /// The row's owner (or the containers' label's once the row is gone):
    /// what row-level security shows orchestrators by.
    pub owner: &'a str,
    /// The incarnation of the row the events are about, if known.
    pub incarnation: Option<&'a Incarnation>,
    /// The events, oldest first, already scrubbed of credentials.
    pub events: &'a [Event],
    /// How many events to keep for the sandbox and this owner (their newest).
    pub keep: u32,
}

/// The state store. Every method may fail; none may be trusted to return
/// promptly (the controller bounds each call).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Whether the database answers.
    async fn ping(&self) -> Result<(), StoreError>;
    /// The identity of this state database (`sandbox_identity`).
    async fn state_id(&self) -> Result<StateId, StoreError>;
    /// One desired row, engine names resolved against the registry.
    async fn fetch_desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, StoreError>;
    /// One status row.
    async fn fetch_status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, StoreError>;
    /// Every desired row whose id is valid (the others are skipped with a
    /// warning: no container or status can be made for them).
    async fn list_desired(&self) -> Result<Vec<DesiredSandbox>, StoreError>;
    /// Ids of every desired row, raw as stored.
    async fn desired_ids(&self) -> Result<Vec<String>, StoreError>;
    /// Records a use of the sandbox seen at `at` (a client connected to
    /// one of its engines): its `last_used_at` moves to `at` (never past
    /// the database's now, never backwards; no new generation, no NOTIFY).
    /// Returns the row's `last_used_at` afterwards, `None` if it is gone.
    async fn mark_used(
        &self,
        id: &SandboxId,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError>;
    /// Ids whose desired row was deleted row by row (not truncated), and
    /// forgets those older than `keep`.
    async fn released_ids(&self, keep: Duration) -> Result<Vec<String>, StoreError>;
    /// Whether reaping is paused (the breaker), and why.
    async fn reaping(&self) -> Result<ReapingState, StoreError>;
    /// Records that reaping is paused, and why (kept from the first trip).
    async fn pause_reaping(&self, reason: &str) -> Result<(), StoreError>;
    /// Every status row, ordered by id.
    async fn list_status(&self) -> Result<Vec<SandboxStatus>, StoreError>;
    /// Every status row, ordered by id, without secrets: each engine's
    /// `password`, `url` and `env` are empty (see
    /// [`SandboxStatus::redacted`](crate::domain::sandbox::SandboxStatus::redacted)).
    /// For looking at the whole fleet (a relist): a fraction of the
    /// memory and bytes read, and no credential of the fleet held. Never
    /// the basis of a status write; a reconcile reads its row whole.
    async fn list_status_redacted(&self) -> Result<Vec<SandboxStatus>, StoreError>;
    /// Writes a status row as the leader of `term`; unchanged content is
    /// not rewritten. [`StoreError::Fenced`] when `term` is not the
    /// current, unexpired lease's.
    async fn write_status(
        &self,
        id: &SandboxId,
        update: &StatusUpdate,
        term: Term,
    ) -> Result<(), StoreError>;
    /// Deletes a status row as the leader of `term` (fenced like
    /// [`Store::write_status`]).
    async fn delete_status(&self, id: &SandboxId, term: Term) -> Result<(), StoreError>;
    /// Takes the leader lease for `holder` for `duration` if nobody holds
    /// it or its holder's lease has expired: the new term, or `None` while
    /// another holder's lease is valid.
    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<Option<Term>, StoreError>;
    /// Extends `holder`'s lease of `term` by `duration` from now; `false`
    /// when it is no longer theirs or has expired.
    async fn renew_lease(
        &self,
        holder: &str,
        term: Term,
        duration: Duration,
    ) -> Result<bool, StoreError>;
    /// Gives the lease up at once, if `holder` still holds `term`.
    async fn release_lease(&self, holder: &str, term: Term) -> Result<(), StoreError>;
    /// Who holds the lease, if anyone ever did.
    async fn lease(&self) -> Result<Option<LeaseHolder>, StoreError>;
    /// Every recorded claim of a warm-pool container.
    async fn pool_claims(&self) -> Result<Vec<PoolClaim>, StoreError>;
    /// What is known of the seed `hash` (`sandbox_seed_put`'s) without
    /// reading its content, `None` when no owner registered it. Content
    /// is fixed by its hash, so any owner's copy is the same.
    async fn seed(&self, hash: &SeedHash) -> Result<Option<SeedInfo>, StoreError>;
    /// At most `len` bytes of the seed `hash`'s content from byte
    /// `offset`: how a seed is read, a chunk at a time (never whole).
    /// `None` when no owner holds it any more.
    async fn seed_chunk(
        &self,
        hash: &SeedHash,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// Records a claim as the leader of `term` (fenced like
    /// [`Store::write_status`]), before the container is changed.
    async fn record_claim(&self, claim: &PoolClaim, term: Term) -> Result<(), StoreError>;
    /// Deletes the claim of `container` (it was removed), fenced.
    async fn delete_claim(&self, container: &ContainerId, term: Term) -> Result<(), StoreError>;
    /// Records events as the leader of `term` (fenced like
    /// [`Store::write_status`]): an event equal to the sandbox's latest one
    /// is counted on it instead of added, every password of the sandbox's
    /// status is replaced by `***`, and only the newest `batch.keep` events (per owner)
    /// of the sandbox stay. Each event is announced on `NOTIFY
    /// sandbox_events` with the write; returns the recorded events in full
    /// (as counted: a repeat has its row's seq and new count), for the
    /// webhook.
    async fn record_events(
        &self,
        batch: EventBatch<'_>,
        term: Term,
    ) -> Result<Vec<EventNotice>, StoreError>;
    /// Deletes every event that last happened longer ago than `age`;
    /// returns how many went.
    async fn prune_events(&self, age: Duration) -> Result<u64, StoreError>;
    /// Deletes every seed no desired row names and none named for
    /// `unnamed_for` (`sandbox_seeds_prune`); returns how many went.
    async fn prune_seeds(&self, unnamed_for: Duration) -> Result<u64, StoreError>;
    /// The sandbox's checkpoints and its resets not done yet
    /// (`sandbox_checkpoints`, `sandbox_resets`).
    async fn checkpoint_work(&self, id: &SandboxId) -> Result<Work, StoreError>;
    /// The sandboxes with a checkpoint or a reset requested and not done
    /// yet: a relist reconciles them whether or not the lists show them
    /// converged (the request's NOTIFY may never have come).
    async fn pending_work(&self) -> Result<Vec<SandboxId>, StoreError>;
    /// The cluster's notification queue: how full it is, and how many
    /// notifications sandboxd's writes have skipped because it was filling.
    async fn notify_queue(&self) -> Result<NotifyQueue, StoreError>;
    /// Records how request `request` for checkpoint `name` of `id` ended,
    /// as the leader of `term` (fenced); a newer request of that name is
    /// left alone.
    async fn finish_checkpoint(
        &self,
        id: &SandboxId,
        name: &str,
        request: i64,
        outcome: &Outcome,
        term: Term,
    ) -> Result<(), StoreError>;
    /// Records how reset `request` ended (`Err`: why it failed), as the
    /// leader of `term` (fenced).
    async fn finish_reset(
        &self,
        request: i64,
        outcome: Result<(), &str>,
        term: Term,
    ) -> Result<(), StoreError>;
    /// Subscribes to changes of desired rows. Subscribed once this returns.
    async fn watch_desired(&self) -> Result<NotifyStream, StoreError>;
    /// The limits that apply to `owner` (`sandbox_quotas`: its own row,
    /// else the default row `*`, else unlimited).
    async fn owner_quota(&self, owner: &str) -> Result<Quota, StoreError>;
}
