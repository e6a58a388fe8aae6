//! An in-memory state store.

use super::Faults;
use crate::domain::breaker::ReapingState;
use crate::domain::checkpoint::{self, Outcome, Work};
use crate::domain::event::Event;
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::identity::{Incarnation, StateId};
use crate::domain::lease::{LeaseHolder, Term};
use crate::domain::pool::PoolClaim;
use crate::domain::sandbox::{DesiredSandbox, Phase, SandboxStatus};
use crate::domain::seed::{SeedHash, SeedInfo, HEAD_BYTES};
use crate::domain::status::StatusUpdate;
use crate::ports::store::{EventBatch, NotifyStream, Store, StoreError};
use async_trait::async_trait;
use futures::channel::mpsc;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The store's operations, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StoreOp {
    Ping,
    StateId,
    FetchDesired,
    FetchStatus,
    ListIds,
    ListStatus,
    WriteStatus,
    DeleteStatus,
    Watch,
    Lease,
    Quota,
}

#[derive(Default)]
struct Tables {
    desired: BTreeMap<SandboxId, DesiredSandbox>,
    status: BTreeMap<SandboxId, SandboxStatus>,
    subscribers: Vec<mpsc::UnboundedSender<Result<String, StoreError>>>,
    status_writes: u32,
    lease: Option<FakeLease>,
    reaping: ReapingState,
    /// Tombstones of rows deleted one by one.
    released: std::collections::BTreeSet<String>,
    /// Claimed warm-pool containers.
    claims: BTreeMap<ContainerId, PoolClaim>,
    /// Each sandbox's events by owner (as `sandbox_record_events` keeps
    /// them: an id's next owner prunes none of the last one's), oldest
    /// first, with how many times each happened in a row.
    events: BTreeMap<(SandboxId, String), Vec<(Event, u32)>>,
    /// The seq of each sandbox's latest event (as `sandbox_events.seq`).
    last_event_seq: BTreeMap<SandboxId, i64>,
    /// The last seq given out.
    event_seq: i64,
    quotas: BTreeMap<String, crate::domain::admission::Quota>,
    /// Each sandbox's checkpoints and resets (what `sandbox_checkpoint` and
    /// `sandbox_reset` wrote), with the outcomes recorded.
    checkpoints: BTreeMap<SandboxId, Work>,
    /// How each reset request ended.
    resets_done: BTreeMap<i64, Result<(), String>>,
    /// Registered seeds, by hash: their engine and content.
    seeds: BTreeMap<SeedHash, (String, Vec<u8>)>,
}

/// The lease row, with its expiry on tokio's clock (so paused-time tests
/// can let it run out).
#[derive(Debug, Clone)]
struct FakeLease {
    holder: String,
    term: Term,
    expires: Instant,
}

impl Tables {
    fn next_request(&self) -> i64 {
        let most = self
            .checkpoints
            .values()
            .flat_map(|w| {
                w.checkpoints
                    .iter()
                    .map(|c| c.request)
                    .chain(w.resets.iter().map(|r| r.request))
            })
            .chain(self.resets_done.keys().copied())
            .max();
        most.unwrap_or(0) + 1
    }

    fn lease_valid(&self, term: Term) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| l.term == term && l.expires > Instant::now())
    }

    /// Wakes every watcher of the desired rows with `payload` (a row's
    /// id, or `*`: all of them), as the database's notification does.
    fn notify(&mut self, payload: &str) {
        self.subscribers
            .retain(|tx| tx.unbounded_send(Ok(payload.to_owned())).is_ok());
    }

    fn fenced(&self, term: Term) -> Result<(), StoreError> {
        if self.lease_valid(term) {
            Ok(())
        } else {
            Err(StoreError::Fenced { term })
        }
    }
}

/// A store that keeps its rows in memory and notifies like the triggers do.
#[derive(Default)]
pub(crate) struct FakeStore {
    tables: Mutex<Tables>,
    /// Faults to inject, by operation.
    pub(crate) faults: Faults<StoreOp>,
}

/// The hash a seed of `content` is registered under.
pub(crate) fn seed_hash(content: &[u8]) -> SeedHash {
    use sha2::{Digest, Sha256};
    let hex: String = Sha256::digest(content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    SeedHash::parse(&format!("sha256:{hex}")).expect("a well-formed hash")
}

/// The identity every fake store has.
pub(crate) const FAKE_STATE_ID: &str = "5a5a5a5a-0000-4000-8000-000000000001";

/// A random uuid in Postgres's text form.
fn random_uuid() -> String {
    let hex = format!("{:032x}", crate::domain::entropy::u128());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn injected(op: &'static str, reason: String) -> StoreError {
    StoreError::Query {
        op,
        source: reason.into(),
    }
}

impl FakeStore {
    /// Inserts or replaces a desired row, bumping its generation and
    /// owning its incarnation like the database does (a new one on insert,
    /// the row's on update), and notifies.
    /// Asks for checkpoint `name` of `id` as `sandbox_checkpoint` would;
    /// returns the request number.
    pub(crate) fn request_checkpoint(&self, id: &SandboxId, name: &str) -> i64 {
        let mut t = self.tables.lock().unwrap();
        let request = t.next_request();
        let work = t.checkpoints.entry(id.clone()).or_default();
        work.checkpoints.retain(|c| c.name != name);
        work.checkpoints.push(checkpoint::Checkpoint {
            name: name.into(),
            request,
            incarnation: None,
            state: "requested".into(),
            instances: BTreeMap::new(),
            size_bytes: None,
        });
        request
    }

    /// Asks for a reset of `id` to `name` as `sandbox_reset` would;
    /// returns the request number.
    pub(crate) fn request_reset(&self, id: &SandboxId, name: &str) -> i64 {
        let mut t = self.tables.lock().unwrap();
        let request = t.next_request();
        t.checkpoints
            .entry(id.clone())
            .or_default()
            .resets
            .push(checkpoint::Reset {
                request,
                checkpoint: name.into(),
                incarnation: None,
            });
        request
    }

    /// The state of checkpoint `name` of `id`.
    pub(crate) fn checkpoint_state(&self, id: &SandboxId, name: &str) -> Option<String> {
        let t = self.tables.lock().unwrap();
        t.checkpoints
            .get(id)?
            .checkpoints
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.state.clone())
    }

    /// How reset `request` ended, once it did.
    pub(crate) fn reset_outcome(&self, request: i64) -> Option<Result<(), String>> {
        self.tables
            .lock()
            .unwrap()
            .resets_done
            .get(&request)
            .cloned()
    }

    pub(crate) fn put_desired(&self, mut row: DesiredSandbox) -> i64 {
        let mut t = self.tables.lock().unwrap();
        row.generation = t.desired.get(&row.id).map_or(1, |d| d.generation + 1);
        t.released.remove(row.id.as_str());
        row.incarnation = Some(match t.desired.get(&row.id) {
            Some(d) => d.incarnation.clone().expect("rows carry an incarnation"),
            None => Incarnation::parse(&random_uuid()).expect("a uuid"),
        });
        let generation = row.generation;
        let id = row.id.clone();
        t.desired.insert(id.clone(), row);
        t.notify(id.as_str());
        generation
    }

    /// Records a use of row `id` at `at`, as `sandbox_touch` does, and
    /// wakes the controllers: the row's `last_used_at` before, if the row
    /// is there.
    pub(crate) fn touch(
        &self,
        id: &SandboxId,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let mut t = self.tables.lock().unwrap();
        let row = t.desired.get_mut(id)?;
        let before = row.last_used_at;
        row.last_used_at = before.max(at);
        t.notify(id.as_str());
        Some(before)
    }

    /// Registers `content` as a seed of `engine` (as `sandbox_seed_put`):
    /// its hash.
    pub(crate) fn put_seed(&self, engine: &str, content: &[u8]) -> SeedHash {
        let hash = seed_hash(content);
        self.tables
            .lock()
            .unwrap()
            .seeds
            .insert(hash.clone(), (engine.to_owned(), content.to_vec()));
        hash
    }

    /// The content of the seed `hash`, if it is registered.
    pub(crate) fn seed_content(&self, hash: &SeedHash) -> Option<Vec<u8>> {
        let t = self.tables.lock().unwrap();
        t.seeds.get(hash).map(|(_, content)| content.clone())
    }

    /// Sets the limits of `owner` (`*`: the default).
    pub(crate) fn set_quota(&self, owner: &str, quota: crate::domain::admission::Quota) {
        self.tables
            .lock()
            .unwrap()
            .quotas
            .insert(owner.to_owned(), quota);
    }

    /// The limits of `owner` (or the default's).
    pub(crate) fn quota_of(&self, owner: &str) -> crate::domain::admission::Quota {
        let t = self.tables.lock().unwrap();
        t.quotas
            .get(owner)
            .or_else(|| t.quotas.get("*"))
            .copied()
            .unwrap_or_default()
    }

    /// Deletes a desired row (leaving a tombstone, like the trigger) and notifies.
    pub(crate) fn delete_desired(&self, id: &SandboxId) {
        let mut t = self.tables.lock().unwrap();
        t.desired.remove(id);
        t.released.insert(id.to_string());
        t.notify(id.as_str());
    }

    /// The incarnation of `id`'s desired row, if there is one.
    pub(crate) fn incarnation_of(&self, id: &SandboxId) -> Option<Incarnation> {
        let t = self.tables.lock().unwrap();
        t.desired.get(id).and_then(|d| d.incarnation.clone())
    }

    /// The status row of `id`.
    pub(crate) fn status_of(&self, id: &SandboxId) -> Option<SandboxStatus> {
        self.tables.lock().unwrap().status.get(id).cloned()
    }

    /// The phase of `id`'s status, if any.
    pub(crate) fn phase_of(&self, id: &SandboxId) -> Option<Phase> {
        self.status_of(id).map(|s| s.phase)
    }

    /// Another process takes the lease now (the next term), as if this
    /// one's had run out.
    pub(crate) fn steal_lease(&self, holder: &str, duration: Duration) -> Term {
        let mut t = self.tables.lock().unwrap();
        let term = Term(t.lease.as_ref().map_or(1, |l| l.term.0 + 1));
        t.lease = Some(FakeLease {
            holder: holder.into(),
            term,
            expires: Instant::now() + duration,
        });
        term
    }

    /// The holder and term of the lease, if any.
    pub(crate) fn lease_of(&self) -> Option<(String, Term)> {
        let t = self.tables.lock().unwrap();
        t.lease.as_ref().map(|l| (l.holder.clone(), l.term))
    }

    /// What `sandboxd resume-reaping` does: reaping resumes, and every
    /// subscriber is told to relist.
    pub(crate) fn resume_reaping(&self) {
        let mut t = self.tables.lock().unwrap();
        t.reaping.paused = false;
        t.notify("*");
    }

    /// Deletes every desired row at once, as `TRUNCATE` does.
    pub(crate) fn truncate_desired(&self) {
        let mut t = self.tables.lock().unwrap();
        t.desired.clear();
        t.notify("*");
    }

    /// Whether reaping is paused.
    pub(crate) fn reaping_paused(&self) -> bool {
        self.tables.lock().unwrap().reaping.paused
    }

    /// The events recorded for `id`, each owner's oldest first, with their
    /// counts.
    pub(crate) fn events_of(&self, id: &SandboxId) -> Vec<(Event, u32)> {
        let t = self.tables.lock().unwrap();
        t.events
            .iter()
            .filter(|((sandbox, _), _)| sandbox == id)
            .flat_map(|(_, kept)| kept.iter().cloned())
            .collect()
    }

    /// The desired row of `id`, if there is one.
    pub(crate) fn desired_of(&self, id: &SandboxId) -> Option<DesiredSandbox> {
        self.tables.lock().unwrap().desired.get(id).cloned()
    }

    /// Every desired row, by id.
    pub(crate) fn desired_rows(&self) -> Vec<DesiredSandbox> {
        self.tables
            .lock()
            .unwrap()
            .desired
            .values()
            .cloned()
            .collect()
    }

    /// Runs `f` over the desired rows and the status rows as they are,
    /// without copying them.
    pub(crate) fn with_rows<T>(
        &self,
        f: impl FnOnce(&BTreeMap<SandboxId, DesiredSandbox>, &BTreeMap<SandboxId, SandboxStatus>) -> T,
    ) -> T {
        let t = self.tables.lock().unwrap();
        f(&t.desired, &t.status)
    }

    /// The tombstones of rows deleted one by one.
    pub(crate) fn released(&self) -> Vec<String> {
        self.tables
            .lock()
            .unwrap()
            .released
            .iter()
            .cloned()
            .collect()
    }

    /// The most events any sandbox has kept for one owner.
    pub(crate) fn most_events_kept(&self) -> usize {
        let t = self.tables.lock().unwrap();
        t.events.values().map(Vec::len).max().unwrap_or(0)
    }

    /// Who holds the lease now, if anyone does (what the database would
    /// answer, whatever any process believes).
    /// The recorded warm-pool claims, by container.
    pub(crate) fn claims(&self) -> BTreeMap<ContainerId, PoolClaim> {
        self.tables.lock().unwrap().claims.clone()
    }

    pub(crate) fn lease_holder_now(&self) -> Option<String> {
        let t = self.tables.lock().unwrap();
        t.lease
            .as_ref()
            .filter(|l| l.expires > Instant::now())
            .map(|l| l.holder.clone())
    }

    /// Puts the desired table back to `rows` (an older copy of it, or
    /// none: an emptied database), as a restore from backup does, and
    /// tells every subscriber to relist.
    pub(crate) fn restore_desired(&self, rows: Vec<DesiredSandbox>) {
        // Rows the copy lacks vanish without tombstones, as in a TRUNCATE:
        // the reaping breaker must weigh them. Rows it brings back lose
        // theirs, as a row inserted again does.
        let mut t = self.tables.lock().unwrap();
        t.released
            .retain(|id| !rows.iter().any(|r| r.id.as_str() == id.as_str()));
        t.desired = rows.into_iter().map(|r| (r.id.clone(), r)).collect();
        t.notify("*");
    }

    /// How many status writes succeeded.
    pub(crate) fn status_writes(&self) -> u32 {
        self.tables.lock().unwrap().status_writes
    }
}

#[async_trait]
impl Store for FakeStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.faults
            .check(StoreOp::Ping)
            .await
            .map_err(|e| injected("ping", e))
    }

    async fn state_id(&self) -> Result<StateId, StoreError> {
        self.faults
            .check(StoreOp::StateId)
            .await
            .map_err(|e| injected("read identity", e))?;
        Ok(StateId::parse(FAKE_STATE_ID).expect("a uuid"))
    }

    async fn fetch_desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, StoreError> {
        self.faults
            .check(StoreOp::FetchDesired)
            .await
            .map_err(|e| injected("read desired row", e))?;
        Ok(self.tables.lock().unwrap().desired.get(id).cloned())
    }

    async fn fetch_status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, StoreError> {
        self.faults
            .check(StoreOp::FetchStatus)
            .await
            .map_err(|e| injected("read status row", e))?;
        Ok(self.status_of(id))
    }

    async fn list_desired(&self) -> Result<Vec<DesiredSandbox>, StoreError> {
        self.faults
            .check(StoreOp::ListIds)
            .await
            .map_err(|e| injected("list desired rows", e))?;
        Ok(self
            .tables
            .lock()
            .unwrap()
            .desired
            .values()
            .cloned()
            .collect())
    }

    async fn desired_ids(&self) -> Result<Vec<String>, StoreError> {
        self.faults
            .check(StoreOp::ListIds)
            .await
            .map_err(|e| injected("list desired ids", e))?;
        let t = self.tables.lock().unwrap();
        Ok(t.desired.keys().map(|id| id.to_string()).collect())
    }

    async fn mark_used(
        &self,
        id: &SandboxId,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        self.faults
            .check(StoreOp::FetchDesired)
            .await
            .map_err(|e| injected("record a use of the sandbox", e))?;
        let mut t = self.tables.lock().unwrap();
        Ok(t.desired.get_mut(id).map(|d| {
            d.last_used_at = d.last_used_at.max(at);
            d.last_used_at
        }))
    }

    async fn released_ids(&self, _keep: Duration) -> Result<Vec<String>, StoreError> {
        Ok(self
            .tables
            .lock()
            .unwrap()
            .released
            .iter()
            .cloned()
            .collect())
    }

    async fn reaping(&self) -> Result<ReapingState, StoreError> {
        Ok(self.tables.lock().unwrap().reaping.clone())
    }

    async fn pause_reaping(&self, reason: &str) -> Result<(), StoreError> {
        let mut t = self.tables.lock().unwrap();
        if !t.reaping.paused {
            t.reaping = ReapingState {
                paused: true,
                reason: reason.into(),
                paused_at: Some(chrono::Utc::now()),
            };
        }
        Ok(())
    }

    async fn list_status(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        self.faults
            .check(StoreOp::ListStatus)
            .await
            .map_err(|e| injected("list status rows", e))?;
        Ok(self
            .tables
            .lock()
            .unwrap()
            .status
            .values()
            .cloned()
            .collect())
    }

    async fn list_status_redacted(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        self.faults
            .check(StoreOp::ListStatus)
            .await
            .map_err(|e| injected("list status rows", e))?;
        let t = self.tables.lock().unwrap();
        Ok(t.status.values().map(SandboxStatus::redacted).collect())
    }

    async fn write_status(
        &self,
        id: &SandboxId,
        update: &StatusUpdate,
        term: Term,
    ) -> Result<(), StoreError> {
        self.faults
            .check(StoreOp::WriteStatus)
            .await
            .map_err(|e| injected("write status row", e))?;
        let mut t = self.tables.lock().unwrap();
        t.fenced(term)?;
        t.status_writes += 1;
        t.status.insert(
            id.clone(),
            SandboxStatus {
                id: id.clone(),
                phase: update.phase,
                observed_generation: update.observed_generation,
                message: update.message.clone(),
                services: update.services.clone(),
                updated_at: None,
                network: update.network.clone(),
                incarnation: update.incarnation.clone(),
            },
        );
        Ok(())
    }

    async fn delete_status(&self, id: &SandboxId, term: Term) -> Result<(), StoreError> {
        self.faults
            .check(StoreOp::DeleteStatus)
            .await
            .map_err(|e| injected("delete status row", e))?;
        let mut t = self.tables.lock().unwrap();
        t.fenced(term)?;
        t.status.remove(id);
        Ok(())
    }

    async fn seed(&self, hash: &SeedHash) -> Result<Option<SeedInfo>, StoreError> {
        let tables = self.tables.lock().unwrap();
        Ok(tables.seeds.get(hash).map(|(engine, bytes)| SeedInfo {
            hash: hash.clone(),
            engine: engine.clone(),
            size: bytes.len() as u64,
            head: bytes[..bytes.len().min(HEAD_BYTES)].to_vec(),
        }))
    }

    async fn seed_chunk(
        &self,
        hash: &SeedHash,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let tables = self.tables.lock().unwrap();
        Ok(tables.seeds.get(hash).map(|(_, bytes)| {
            let from = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let to = from.saturating_add(len as usize).min(bytes.len());
            bytes[from..to].to_vec()
        }))
    }

    async fn pool_claims(&self) -> Result<Vec<PoolClaim>, StoreError> {
        Ok(self
            .tables
            .lock()
            .unwrap()
            .claims
            .values()
            .cloned()
            .collect())
    }

    async fn record_claim(&self, claim: &PoolClaim, term: Term) -> Result<(), StoreError> {
        let mut t = self.tables.lock().unwrap();
        t.fenced(term)?;
        t.claims.insert(claim.container.clone(), claim.clone());
        Ok(())
    }

    async fn delete_claim(&self, container: &ContainerId, term: Term) -> Result<(), StoreError> {
        let mut t = self.tables.lock().unwrap();
        t.fenced(term)?;
        t.claims.remove(container);
        Ok(())
    }

    async fn record_events(
        &self,
        batch: EventBatch<'_>,
        term: Term,
    ) -> Result<Vec<crate::domain::notice::EventNotice>, StoreError> {
        let mut guard = self.tables.lock().unwrap();
        let t = &mut *guard;
        t.fenced(term)?;
        let kept = t
            .events
            .entry((batch.sandbox.clone(), batch.owner.to_owned()))
            .or_default();
        let mut notices = Vec::with_capacity(batch.events.len());
        let now = chrono::Utc::now();
        for event in batch.events {
            let count = match kept.last_mut() {
                Some((last, count)) if last == event => {
                    *count += 1;
                    *count
                }
                _ => {
                    kept.push((event.clone(), 1));
                    t.event_seq += 1;
                    t.last_event_seq.insert(batch.sandbox.clone(), t.event_seq);
                    1
                }
            };
            notices.push(crate::domain::notice::EventNotice {
                seq: t
                    .last_event_seq
                    .get(batch.sandbox)
                    .copied()
                    .unwrap_or_default(),
                sandbox_id: batch.sandbox.to_string(),
                reason: event.reason.as_str().to_owned(),
                engine: event.engine.clone(),
                detail: event.detail.clone(),
                count: i32::try_from(count).unwrap_or(i32::MAX),
                first_at: now,
                last_at: now,
                owner: batch.owner.to_owned(),
                incarnation: batch.incarnation.map(|i| i.as_str().to_owned()),
                message: event.message.clone(),
            });
        }
        let keep = batch.keep.max(1) as usize;
        if kept.len() > keep {
            kept.drain(..kept.len() - keep);
        }
        Ok(notices)
    }

    async fn owner_quota(
        &self,
        owner: &str,
    ) -> Result<crate::domain::admission::Quota, StoreError> {
        self.faults
            .check(StoreOp::Quota)
            .await
            .map_err(|e| injected("read an owner's quota", e))?;
        Ok(self.quota_of(owner))
    }

    async fn prune_events(&self, _age: Duration) -> Result<u64, StoreError> {
        // The fake keeps no times; its events are bounded per sandbox.
        Ok(0)
    }

    async fn prune_seeds(&self, _unnamed_for: Duration) -> Result<u64, StoreError> {
        // The fake keeps no times; seeds are the real database's to age.
        Ok(0)
    }

    async fn checkpoint_work(&self, id: &SandboxId) -> Result<Work, StoreError> {
        let t = self.tables.lock().unwrap();
        Ok(t.checkpoints.get(id).cloned().unwrap_or_default())
    }

    async fn pending_work(&self) -> Result<Vec<SandboxId>, StoreError> {
        let t = self.tables.lock().unwrap();
        Ok(t.checkpoints
            .iter()
            .filter(|(_, w)| {
                !w.resets.is_empty() || w.checkpoints.iter().any(|c| c.state == "requested")
            })
            .map(|(id, _)| id.clone())
            .collect())
    }

    async fn notify_queue(&self) -> Result<crate::ports::store::NotifyQueue, StoreError> {
        // No queue here: nothing fills it and nothing is skipped.
        Ok(crate::ports::store::NotifyQueue::default())
    }

    async fn finish_checkpoint(
        &self,
        id: &SandboxId,
        name: &str,
        request: i64,
        outcome: &Outcome,
        term: Term,
    ) -> Result<(), StoreError> {
        let mut t = self.tables.lock().unwrap();
        t.fenced(term)?;
        let work = t.checkpoints.entry(id.clone()).or_default();
        if let Some(c) = work
            .checkpoints
            .iter_mut()
            .find(|c| c.name == name && c.request == request)
        {
            match outcome {
                Outcome::Ready {
                    instances,
                    size_bytes,
                } => {
                    c.state = "ready".into();
                    c.instances.clone_from(instances);
                    c.size_bytes = Some(*size_bytes);
                }
                Outcome::Failed(_) => c.state = "failed".into(),
            }
        }
        Ok(())
    }

    async fn finish_reset(
        &self,
        request: i64,
        outcome: Result<(), &str>,
        term: Term,
    ) -> Result<(), StoreError> {
        let mut t = self.tables.lock().unwrap();
        t.fenced(term)?;
        for work in t.checkpoints.values_mut() {
            work.resets.retain(|r| r.request != request);
        }
        t.resets_done
            .insert(request, outcome.map_err(str::to_owned));
        Ok(())
    }

    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<Option<Term>, StoreError> {
        self.faults
            .check(StoreOp::Lease)
            .await
            .map_err(|e| injected("acquire the leader lease", e))?;
        let mut t = self.tables.lock().unwrap();
        if t.lease.as_ref().is_some_and(|l| l.expires > Instant::now()) {
            return Ok(None);
        }
        let term = Term(t.lease.as_ref().map_or(1, |l| l.term.0 + 1));
        t.lease = Some(FakeLease {
            holder: holder.into(),
            term,
            expires: Instant::now() + duration,
        });
        Ok(Some(term))
    }

    async fn renew_lease(
        &self,
        holder: &str,
        term: Term,
        duration: Duration,
    ) -> Result<bool, StoreError> {
        self.faults
            .check(StoreOp::Lease)
            .await
            .map_err(|e| injected("renew the leader lease", e))?;
        let mut t = self.tables.lock().unwrap();
        let valid = t.lease_valid(term);
        match t.lease.as_mut() {
            Some(l) if valid && l.holder == holder => {
                l.expires = Instant::now() + duration;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_lease(&self, holder: &str, term: Term) -> Result<(), StoreError> {
        let mut t = self.tables.lock().unwrap();
        if let Some(l) = t.lease.as_mut() {
            if l.holder == holder && l.term == term {
                l.expires = Instant::now();
            }
        }
        Ok(())
    }

    async fn lease(&self) -> Result<Option<LeaseHolder>, StoreError> {
        let t = self.tables.lock().unwrap();
        Ok(t.lease.as_ref().map(|l| LeaseHolder {
            holder: l.holder.clone(),
            term: l.term,
            expires_at: chrono::Utc::now()
                + chrono::Duration::from_std(l.expires.saturating_duration_since(Instant::now()))
                    .unwrap_or_default(),
        }))
    }

    async fn watch_desired(&self) -> Result<NotifyStream, StoreError> {
        self.faults
            .check(StoreOp::Watch)
            .await
            .map_err(|e| injected("listen", e))?;
        let (tx, rx) = mpsc::unbounded();
        self.tables.lock().unwrap().subscribers.push(tx);
        Ok(rx.boxed())
    }
}
