//! The fence: what lets this process change Docker and write statuses, and
//! only while it leads.
//!
//! The elector ([`super::leader`]) grants the fence a term and a moment
//! until which the lease may be trusted (by this process's own monotonic
//! clock, a margin before the database can give the lease to someone
//! else), extends it at every renewal and revokes it when the lease is
//! lost. [`FencedRuntime`] checks it before every call that changes
//! Docker; the reconciler takes the term from it for every status write,
//! which the database checks once more.

use crate::domain::container::{ExecOutput, ObservedContainer, RunState};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::lease::Term;
use crate::domain::pool::PooledContainer;
use crate::metrics::Metrics;
use crate::ports::runtime::{
    ContainerSpec, EventStream, NetworkSpec, NetworkStream, ObservedResource, Runtime,
    RuntimeError, TemplateJob,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// This process may not act: it does not lead, or no longer trusts its
/// lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Fenced {
    /// It never led, or lost the lease.
    #[error("this sandboxd is not the leader (it stands by while another holds the lease)")]
    NotLeader,
    /// It led, but its last renewal is too old to trust the lease.
    #[error("this sandboxd's leader lease of term {0} could not be renewed in time; it stops acting until it leads again")]
    Expired(Term),
}

#[derive(Debug, Clone, Copy)]
struct Grant {
    term: Term,
    until: Instant,
}

/// Shared and cheap to clone: the term this process leads in, and until
/// when it trusts that.
#[derive(Debug, Clone, Default)]
pub struct Fence(Arc<Mutex<Option<Grant>>>);

impl Fence {
    /// Leads in `term` until `until`; a later renewal moves `until`.
    pub(crate) fn grant(&self, term: Term, until: Instant) {
        *self.lock() = Some(Grant { term, until });
    }

    /// Stops acting at once.
    pub(crate) fn revoke(&self) {
        *self.lock() = None;
    }

    /// The term to act in, if this process leads and still trusts its lease.
    pub fn check(&self) -> Result<Term, Fenced> {
        match *self.lock() {
            None => Err(Fenced::NotLeader),
            Some(g) if Instant::now() < g.until => Ok(g.term),
            Some(g) => Err(Fenced::Expired(g.term)),
        }
    }

    /// Until when the lease is trusted, if one is held.
    pub(crate) fn until(&self) -> Option<Instant> {
        self.lock().map(|g| g.until)
    }

    /// The term held, trusted or not.
    pub fn term(&self) -> Option<Term> {
        self.lock().map(|g| g.term)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Grant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A [`Runtime`] that refuses every call changing Docker unless the fence
/// lets this process act; reads always pass.
pub(crate) struct FencedRuntime {
    inner: Arc<dyn Runtime>,
    fence: Fence,
    metrics: Arc<Metrics>,
}

impl FencedRuntime {
    /// Fences the mutations of `inner`.
    pub(crate) fn new(inner: Arc<dyn Runtime>, fence: Fence, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            fence,
            metrics,
        }
    }

    fn admit(&self, op: &'static str, target: &str) -> Result<Instant, RuntimeError> {
        let refused = |why: Fenced| {
            self.metrics.fenced("docker");
            tracing::warn!(op, target, reason = %why, "docker change refused: not leading");
            RuntimeError::Refused(format!("docker {op} for {target} refused: {why}"))
        };
        self.fence.check().map_err(refused)?;
        self.fence.until().ok_or_else(|| refused(Fenced::NotLeader))
    }

    /// Runs the change `call` if this process may act, and only while it
    /// trusts its lease (renewals extend that as the call goes on): a
    /// change still under way when trust runs out is given up, as far as
    /// Docker lets a request be given up.
    async fn fenced<T>(
        &self,
        op: &'static str,
        target: &str,
        call: impl std::future::Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        let mut until = self.admit(op, target)?;
        let mut call = std::pin::pin!(call);
        loop {
            tokio::select! {
                result = &mut call => return result,
                () = tokio::time::sleep_until(until) => {}
            }
            match (self.fence.check(), self.fence.until()) {
                (Ok(_), Some(later)) if later > until => until = later,
                _ => {
                    self.metrics.fenced("docker");
                    tracing::warn!(
                        op,
                        target,
                        "docker change given up: the leader lease ran out while it was under way"
                    );
                    return Err(RuntimeError::Refused(format!(
                        "docker {op} for {target} given up: this sandboxd's leader lease ran out while it was under way"
                    )));
                }
            }
        }
    }
}

#[async_trait]
impl Runtime for FencedRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.inner.ping().await
    }

    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        self.inner.host_memory().await
    }

    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        self.inner.list(deployment, sandbox).await
    }

    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        self.fenced(
            "network create",
            &spec.name,
            self.inner.ensure_network(spec),
        )
        .await
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        self.inner.networks(deployment).await
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        self.fenced(
            "network remove",
            name,
            self.inner.remove_network(name, deployment),
        )
        .await
    }

    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        self.inner.network_members(network).await
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.fenced(
            "network connect",
            container,
            self.inner.connect(network, container),
        )
        .await
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.fenced(
            "network disconnect",
            container,
            self.inner.disconnect(network, container),
        )
        .await
    }

    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        self.inner.volumes(deployment).await
    }

    async fn remove_volume(&self, name: &str, deployment: &Deployment) -> Result<(), RuntimeError> {
        self.fenced(
            "volume remove",
            name,
            self.inner.remove_volume(name, deployment),
        )
        .await
    }

    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        self.inner.image_labels(image).await
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        self.inner.image_id(image).await
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        // Fetching an image changes no sandbox.
        self.inner.pull(image).await
    }

    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        self.fenced("template job", &job.name, self.inner.run_template_job(job))
            .await
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        self.fenced("create", &spec.name, self.inner.create_and_start(spec))
            .await
    }

    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        self.fenced("rename", id.as_str(), self.inner.rename(id, name))
            .await
    }

    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError> {
        self.fenced(
            "network rejoin",
            id.as_str(),
            self.inner.rejoin(network, id, aliases),
        )
        .await
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        self.inner.published_port(id).await
    }

    async fn published_host(&self, id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        self.inner.published_host(id).await
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        self.inner.inspect(id).await
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        self.fenced("remove", id.as_str(), self.inner.remove(id, stop_timeout))
            .await
    }

    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.fenced("pause", id.as_str(), self.inner.pause(id))
            .await
    }

    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.fenced("unpause", id.as_str(), self.inner.unpause(id))
            .await
    }

    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError> {
        self.inner.logs_tail(id, lines).await
    }

    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        // Setting up users and databases inside an engine changes it.
        self.fenced("exec", id.as_str(), self.inner.exec(id, cmd, env))
            .await
    }

    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        self.inner.pool_containers(deployment).await
    }

    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        self.inner.events(deployment, since)
    }

    fn removed_networks(&self) -> NetworkStream {
        self.inner.removed_networks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeRuntime;

    fn fenced_runtime(fence: &Fence) -> FencedRuntime {
        FencedRuntime::new(
            Arc::new(FakeRuntime::default()),
            fence.clone(),
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_under_way_when_the_lease_runs_out_is_given_up() {
        let fence = Fence::default();
        let rt = fenced_runtime(&fence);
        fence.grant(Term(1), Instant::now() + Duration::from_secs(10));
        let started = Instant::now();
        let result = rt
            .fenced(
                "create",
                "c",
                std::future::pending::<Result<(), RuntimeError>>(),
            )
            .await;
        assert!(matches!(result, Err(RuntimeError::Refused(m)) if m.contains("given up")));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_change_goes_on_while_renewals_keep_the_lease_trusted() {
        let fence = Fence::default();
        let rt = fenced_runtime(&fence);
        fence.grant(Term(1), Instant::now() + Duration::from_secs(10));
        let renewer = tokio::spawn({
            let fence = fence.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    fence.grant(Term(1), Instant::now() + Duration::from_secs(10));
                }
            }
        });
        let long = async {
            tokio::time::sleep(Duration::from_secs(25)).await;
            Ok::<_, RuntimeError>(7)
        };
        assert_eq!(rt.fenced("exec", "c", long).await.unwrap(), 7);
        renewer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn no_change_starts_without_the_lease() {
        let fence = Fence::default();
        let rt = fenced_runtime(&fence);
        let result = rt
            .remove(&ContainerId::new("c"), Duration::from_secs(1))
            .await;
        assert!(matches!(result, Err(RuntimeError::Refused(m)) if m.contains("not the leader")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_admits_its_term_until_the_trusted_moment_and_nothing_after() {
        let fence = Fence::default();
        assert_eq!(fence.check(), Err(Fenced::NotLeader));
        fence.grant(Term(3), Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Ok(Term(3)));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(fence.check(), Ok(Term(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(fence.check(), Err(Fenced::Expired(Term(3))));
        fence.grant(Term(3), Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Ok(Term(3)));
        fence.revoke();
        assert_eq!(fence.check(), Err(Fenced::NotLeader));
    }
}
