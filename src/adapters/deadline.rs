//! Deadlines on every call to the runtime and the store: decorators that
//! turn a call that does not answer in time into a `Timeout` error, so a
//! stuck Docker daemon or a lock in Postgres costs one retry, not a worker.

use crate::domain::breaker::ReapingState;
use crate::domain::checkpoint::{Outcome, Work};
use crate::domain::container::{ExecOutput, ObservedContainer, RunState};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::identity::StateId;
use crate::domain::lease::{LeaseHolder, Term};
use crate::domain::pool::{PoolClaim, PooledContainer};
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus};
use crate::domain::status::StatusUpdate;
use crate::ports::runtime::{
    ContainerSpec, EventStream, NetworkSpec, NetworkStream, ObservedResource, Runtime,
    RuntimeError, TemplateJob,
};
use crate::ports::store::{EventBatch, NotifyStream, Store, StoreError};
use async_trait::async_trait;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long runtime calls may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeDeadlines {
    /// Any call but a pull (a removal gets its stop timeout on top).
    pub call: Duration,
    /// Pulling an image.
    pub pull: Duration,
    /// Running a template job (`--template-timeout`).
    pub job: Duration,
}

async fn runtime_call<T>(
    op: &'static str,
    target: &str,
    after: Duration,
    call: impl Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    let started = tokio::time::Instant::now();
    let result = tokio::time::timeout(after, call).await.unwrap_or_else(|_| {
        Err(RuntimeError::Timeout {
            op,
            target: target.to_owned(),
            after,
        })
    });
    // Where a provision's time goes, call by call (RUST_LOG=...=trace).
    tracing::trace!(
        op,
        target,
        elapsed_ms = started.elapsed().as_millis() as u64,
        ok = result.is_ok(),
        "runtime call"
    );
    result
}

/// A [`Runtime`] whose every call has a deadline.
pub struct BoundedRuntime {
    inner: Arc<dyn Runtime>,
    deadlines: RuntimeDeadlines,
}

impl BoundedRuntime {
    /// Bounds every call of `inner`.
    pub fn new(inner: Arc<dyn Runtime>, deadlines: RuntimeDeadlines) -> Self {
        Self { inner, deadlines }
    }
}

#[async_trait]
impl Runtime for BoundedRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        runtime_call("ping", "the daemon", self.deadlines.call, self.inner.ping()).await
    }

    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        let call = self.inner.host_memory();
        runtime_call("info", "the daemon", self.deadlines.call, call).await
    }

    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        let call = self.inner.list(deployment, sandbox);
        runtime_call("list", deployment.as_str(), self.deadlines.call, call).await
    }

    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        let call = self.inner.ensure_network(spec);
        runtime_call("network", &spec.name, self.deadlines.call, call).await
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let call = self.inner.networks(deployment);
        runtime_call(
            "list networks",
            deployment.as_str(),
            self.deadlines.call,
            call,
        )
        .await
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        let call = self.inner.remove_network(name, deployment);
        runtime_call("remove network", name, self.deadlines.call, call).await
    }

    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        let call = self.inner.network_members(network);
        runtime_call("inspect network", network, self.deadlines.call, call).await
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        let call = self.inner.connect(network, container);
        runtime_call("connect", container, self.deadlines.call, call).await
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        let call = self.inner.disconnect(network, container);
        runtime_call("disconnect", container, self.deadlines.call, call).await
    }

    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        let call = self.inner.image_labels(image);
        runtime_call("inspect image", image, self.deadlines.call, call).await
    }

    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let call = self.inner.volumes(deployment);
        runtime_call(
            "list volumes",
            deployment.as_str(),
            self.deadlines.call,
            call,
        )
        .await
    }

    async fn remove_volume(&self, name: &str, deployment: &Deployment) -> Result<(), RuntimeError> {
        let call = self.inner.remove_volume(name, deployment);
        runtime_call("remove volume", name, self.deadlines.call, call).await
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        let call = self.inner.image_id(image);
        runtime_call("inspect image", image, self.deadlines.call, call).await
    }

    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        let call = self.inner.run_template_job(job);
        runtime_call("template job", &job.name, self.deadlines.job, call).await
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        let after = self.deadlines.pull;
        match tokio::time::timeout(after, self.inner.pull(image)).await {
            Ok(result) => result,
            Err(_) => Err(RuntimeError::ImageUnavailable {
                image: image.to_owned(),
                reason: format!("pull timed out after {after:?}"),
            }),
        }
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        let call = self.inner.create_and_start(spec);
        runtime_call("create", &spec.name, self.deadlines.call, call).await
    }

    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        let call = self.inner.rename(id, name);
        runtime_call("rename", id.as_str(), self.deadlines.call, call).await
    }

    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError> {
        let call = self.inner.rejoin(network, id, aliases);
        runtime_call("rejoin network", id.as_str(), self.deadlines.call, call).await
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        let call = self.inner.published_port(id);
        runtime_call("inspect", id.as_str(), self.deadlines.call, call).await
    }

    async fn published_host(&self, id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        let call = self.inner.published_host(id);
        runtime_call("inspect", id.as_str(), self.deadlines.call, call).await
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        let call = self.inner.inspect(id);
        runtime_call("inspect", id.as_str(), self.deadlines.call, call).await
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        let call = self.inner.remove(id, stop_timeout);
        let after = self.deadlines.call.saturating_add(stop_timeout);
        runtime_call("remove", id.as_str(), after, call).await
    }

    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let call = self.inner.pause(id);
        runtime_call("pause", id.as_str(), self.deadlines.call, call).await
    }

    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let call = self.inner.unpause(id);
        runtime_call("unpause", id.as_str(), self.deadlines.call, call).await
    }

    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError> {
        let call = self.inner.logs_tail(id, lines);
        runtime_call("logs", id.as_str(), self.deadlines.call, call).await
    }

    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        let call = self.inner.exec(id, cmd, env);
        runtime_call("exec", id.as_str(), self.deadlines.call, call).await
    }

    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        let call = self.inner.pool_containers(deployment);
        runtime_call("list", deployment.as_str(), self.deadlines.call, call).await
    }

    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        // A stream has no deadline: it is meant to stay open. The watcher
        // reconnects when it ends.
        self.inner.events(deployment, since)
    }

    fn removed_networks(&self) -> NetworkStream {
        // As the event stream: open for good, its connect bounded by the
        // adapter.
        self.inner.removed_networks()
    }
}

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
