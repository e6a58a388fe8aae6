//! A deadline on every call to the store: a decorator that turns a call
//! that does not answer in time into a `Timeout` error, so a lock in
//! Postgres costs one retry, not a worker. (The runtime's deadlines go with
//! its fence, in one layer: `controller::GuardedRuntime`.)

use crate::domain::breaker::ReapingState;
use crate::domain::checkpoint::{Outcome, Work};
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::identity::StateId;
use crate::domain::lease::{LeaseHolder, Term};
use crate::domain::pool::PoolClaim;
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus};
use crate::domain::seed::{SeedHash, SeedInfo};
use crate::domain::status::StatusUpdate;
use crate::ports::store::{EventBatch, NotifyStream, Store, StoreError};
use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

async fn store_call<T>(
    op: &'static str,
    after: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(after, call)
        .await
        .unwrap_or(Err(StoreError::Timeout { op, after }))
}

/// A [`Store`] whose every call has a deadline.
pub struct BoundedStore {
    inner: Arc<dyn Store>,
    after: Duration,
}

impl BoundedStore {
    /// Bounds every call of `inner` by `after`.
    pub fn new(inner: Arc<dyn Store>, after: Duration) -> Self {
        Self { inner, after }
    }
}

#[async_trait]
impl Store for BoundedStore {
    async fn ping(&self) -> Result<(), StoreError> {
        store_call("ping", self.after, self.inner.ping()).await
    }

    async fn state_id(&self) -> Result<StateId, StoreError> {
        store_call("read identity", self.after, self.inner.state_id()).await
    }

    async fn fetch_desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, StoreError> {
        store_call("read desired row", self.after, self.inner.fetch_desired(id)).await
    }

    async fn fetch_status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, StoreError> {
        store_call("read status row", self.after, self.inner.fetch_status(id)).await
    }

    async fn list_desired(&self) -> Result<Vec<DesiredSandbox>, StoreError> {
        store_call("list desired rows", self.after, self.inner.list_desired()).await
    }

    async fn desired_ids(&self) -> Result<Vec<String>, StoreError> {
        store_call("list desired ids", self.after, self.inner.desired_ids()).await
    }

    async fn mark_used(
        &self,
        id: &SandboxId,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        let call = self.inner.mark_used(id, at);
        store_call("record a use of the sandbox", self.after, call).await
    }

    async fn released_ids(&self, keep: Duration) -> Result<Vec<String>, StoreError> {
        let call = self.inner.released_ids(keep);
        store_call("list released ids", self.after, call).await
    }

    async fn reaping(&self) -> Result<ReapingState, StoreError> {
        store_call("read the reaping breaker", self.after, self.inner.reaping()).await
    }

    async fn pause_reaping(&self, reason: &str) -> Result<(), StoreError> {
        let call = self.inner.pause_reaping(reason);
        store_call("pause reaping", self.after, call).await
    }

    async fn list_status(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        store_call("list status rows", self.after, self.inner.list_status()).await
    }

    async fn list_status_redacted(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        let call = self.inner.list_status_redacted();
        store_call("list status rows", self.after, call).await
    }

    async fn write_status(
        &self,
        id: &SandboxId,
        update: &StatusUpdate,
        term: Term,
    ) -> Result<(), StoreError> {
        let call = self.inner.write_status(id, update, term);
        store_call("write status row", self.after, call).await
    }

    async fn delete_status(&self, id: &SandboxId, term: Term) -> Result<(), StoreError> {
        let call = self.inner.delete_status(id, term);
        store_call("delete status row", self.after, call).await
    }

    async fn pool_claims(&self) -> Result<Vec<PoolClaim>, StoreError> {
        store_call("read pool claims", self.after, self.inner.pool_claims()).await
    }

    async fn seed(&self, hash: &SeedHash) -> Result<Option<SeedInfo>, StoreError> {
        store_call("read a seed", self.after, self.inner.seed(hash)).await
    }

    async fn seed_chunk(
        &self,
        hash: &SeedHash,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let call = self.inner.seed_chunk(hash, offset, len);
        store_call("read a seed's content", self.after, call).await
    }

    async fn record_claim(&self, claim: &PoolClaim, term: Term) -> Result<(), StoreError> {
        let call = self.inner.record_claim(claim, term);
        store_call("record a pool claim", self.after, call).await
    }

    async fn delete_claim(&self, container: &ContainerId, term: Term) -> Result<(), StoreError> {
        let call = self.inner.delete_claim(container, term);
        store_call("delete a pool claim", self.after, call).await
    }

    async fn record_events(
        &self,
        batch: EventBatch<'_>,
        term: Term,
    ) -> Result<Vec<crate::domain::notice::EventNotice>, StoreError> {
        let call = self.inner.record_events(batch, term);
        store_call("record events", self.after, call).await
    }

    async fn prune_events(&self, age: Duration) -> Result<u64, StoreError> {
        let call = self.inner.prune_events(age);
        store_call("prune events", self.after, call).await
    }

    async fn prune_seeds(&self, unnamed_for: Duration) -> Result<u64, StoreError> {
        let call = self.inner.prune_seeds(unnamed_for);
        store_call("prune seeds", self.after, call).await
    }

    async fn owner_quota(
        &self,
        owner: &str,
    ) -> Result<crate::domain::admission::Quota, StoreError> {
        let call = self.inner.owner_quota(owner);
        store_call("read an owner's quota", self.after, call).await
    }

    async fn checkpoint_work(&self, id: &SandboxId) -> Result<Work, StoreError> {
        let call = self.inner.checkpoint_work(id);
        store_call("read checkpoint requests", self.after, call).await
    }

    async fn pending_work(&self) -> Result<Vec<SandboxId>, StoreError> {
        let call = self.inner.pending_work();
        store_call("list pending checkpoints and resets", self.after, call).await
    }

    async fn notify_queue(&self) -> Result<crate::ports::store::NotifyQueue, StoreError> {
        let call = self.inner.notify_queue();
        store_call("read the notification queue", self.after, call).await
    }

    async fn finish_checkpoint(
        &self,
        id: &SandboxId,
        name: &str,
        request: i64,
        outcome: &Outcome,
        term: Term,
    ) -> Result<(), StoreError> {
        let call = self
            .inner
            .finish_checkpoint(id, name, request, outcome, term);
        store_call("record a checkpoint's outcome", self.after, call).await
    }

    async fn finish_reset(
        &self,
        request: i64,
        outcome: Result<(), &str>,
        term: Term,
    ) -> Result<(), StoreError> {
        let call = self.inner.finish_reset(request, outcome, term);
        store_call("record a reset's outcome", self.after, call).await
    }

    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<Option<Term>, StoreError> {
        let call = self.inner.acquire_lease(holder, duration);
        store_call("acquire the leader lease", self.after, call).await
    }

    async fn renew_lease(
        &self,
        holder: &str,
        term: Term,
        duration: Duration,
    ) -> Result<bool, StoreError> {
        let call = self.inner.renew_lease(holder, term, duration);
        store_call("renew the leader lease", self.after, call).await
    }

    async fn release_lease(&self, holder: &str, term: Term) -> Result<(), StoreError> {
        let call = self.inner.release_lease(holder, term);
        store_call("release the leader lease", self.after, call).await
    }

    async fn lease(&self) -> Result<Option<LeaseHolder>, StoreError> {
        store_call("read the leader lease", self.after, self.inner.lease()).await
    }

    async fn watch_desired(&self) -> Result<NotifyStream, StoreError> {
        store_call("listen", self.after, self.inner.watch_desired()).await
    }
}
