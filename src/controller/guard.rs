//! The one layer every runtime call of the controller goes through: a
//! deadline on each call, so that a stuck Docker daemon costs one retry and
//! not a worker, and for each call that changes Docker the [`Fence`], so
//! that only the leader acts.
//!
//! One forward per method of each of the [`Runtime`]'s roles (an impl
//! block per role) says both things at once: which deadline the call gets
//! (its name and target for the timeout's message) and, for a change, its
//! name in a refusal. Adding a port method is one edit here: the guard
//! forwards every method, defaults included, so that none bypasses it.
//! The composition root builds the layer; the controller is handed it as a
//! plain `Arc<dyn Runtime>`.

use super::fence::{Fence, Fenced};
use crate::domain::attach::Candidate;
use crate::domain::container::{ByteStream, ExecOutput, FilterOutput, ObservedContainer, RunState};
use crate::domain::host_net::RouteConflict;
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::pool::PooledContainer;
use crate::metrics::Metrics;
use crate::ports::runtime::{
    Capabilities, Commands, ContainerSpec, Containers, DiskStore, EventStream, FileContent, Helper,
    Host, Images, NetworkSpec, NetworkStream, Networks, ObservedResource, Runtime, RuntimeError,
    StaleBridge, TemplateJob, VolumeFill, Volumes,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long runtime calls may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RuntimeDeadlines {
    /// Any call but a pull (a removal gets its stop timeout on top).
    pub(crate) call: Duration,
    /// Pulling an image.
    pub(crate) pull: Duration,
    /// Running a template job (`--template-timeout`).
    pub(crate) job: Duration,
}

/// A [`Runtime`] whose every call has a deadline and whose every change
/// waits for the fence; reads are never fenced.
pub(crate) struct GuardedRuntime {
    inner: Arc<dyn Runtime>,
    deadlines: RuntimeDeadlines,
    fence: Fence,
    metrics: Arc<Metrics>,
}

/// `call`, turned into a `Timeout` naming `op` and `target` unless it
/// answers within `after`.
async fn bounded<T>(
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

impl GuardedRuntime {
    /// Guards every call of `inner`: `deadlines` bound them, `fence` lets
    /// the changes through.
    pub(crate) fn new(
        inner: Arc<dyn Runtime>,
        deadlines: RuntimeDeadlines,
        fence: Fence,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner,
            deadlines,
            fence,
            metrics,
        }
    }

    /// A read: its deadline only.
    async fn read<T>(
        &self,
        op: &'static str,
        target: &str,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        bounded(op, target, self.deadlines.call, call).await
    }

    /// A change: the fence (as `fenced_op` in a refusal), then its deadline
    /// (as `op` in a timeout).
    async fn change<T>(
        &self,
        fenced_op: &'static str,
        op: &'static str,
        target: &str,
        after: Duration,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        self.fenced(fenced_op, target, bounded(op, target, after, call))
            .await
    }

    fn admit(&self, op: &'static str, target: &str) -> Result<Instant, RuntimeError> {
        let refused = |why: Fenced| {
            self.metrics.leader.fenced("docker");
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
    ///
    /// Every time the call is polled the clock is read first, not only
    /// when the timer at the trust's end fires: a process that resumes past
    /// that moment (it was frozen, or its clock jumped) may be polled for
    /// the call before its timer is, and must not send what it was about
    /// to. The simulation found that window (docs/simulation.md).
    async fn fenced<T>(
        &self,
        op: &'static str,
        target: &str,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        use std::task::Poll;
        #[cfg(any(test, feature = "simulation"))]
        if crate::domain::mutation::on(crate::domain::mutation::Mutation::SkipFence) {
            return call.await;
        }
        let mut until = self.admit(op, target)?;
        let mut call = std::pin::pin!(call);
        let mut trust_ends = std::pin::pin!(tokio::time::sleep_until(until));
        std::future::poll_fn(|cx| loop {
            if Instant::now() >= until {
                match (self.fence.check(), self.fence.until()) {
                    (Ok(_), Some(later)) if later > until => {
                        until = later;
                        trust_ends.as_mut().reset(until);
                        continue;
                    }
                    _ => {
                        self.metrics.leader.fenced("docker");
                        tracing::warn!(
                            op,
                            target,
                            "docker change given up: the leader lease ran out while it was under way"
                        );
                        return Poll::Ready(Err(RuntimeError::Refused(format!(
                            "docker {op} for {target} given up: this sandboxd's leader lease ran out while it was under way"
                        ))));
                    }
                }
            }
            if let Poll::Ready(result) = call.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            // Wakes this task when trust runs out.
            if trust_ends.as_mut().poll(cx).is_ready() {
                continue;
            }
            return Poll::Pending;
        })
        .await
    }
}

#[async_trait]
impl Host for GuardedRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.read("ping", "the daemon", self.inner.ping()).await
    }

    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        self.read("info", "the daemon", self.inner.host_memory())
            .await
    }

    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        self.read("info", "the daemon", self.inner.oci_runtimes())
            .await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl Containers for GuardedRuntime {
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        let call = self.inner.list(deployment, sandbox);
        self.read("list", deployment.as_str(), call).await
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        let call = self.inner.create_and_start(spec);
        let after = self.deadlines.call;
        self.change("create", "create", &spec.name, after, call)
            .await
    }

    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        let call = self.inner.rename(id, name);
        let after = self.deadlines.call;
        self.change("rename", "rename", id.as_str(), after, call)
            .await
    }

    async fn claim_as(
        &self,
        id: &ContainerId,
        name: &str,
        labels: &HashMap<String, String>,
    ) -> Result<(), RuntimeError> {
        let call = self.inner.claim_as(id, name, labels);
        let after = self.deadlines.call;
        self.change("rename", "rename", id.as_str(), after, call)
            .await
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        let call = self.inner.published_port(id);
        self.read("inspect", id.as_str(), call).await
    }

    async fn published_host(&self, id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        let call = self.inner.published_host(id);
        self.read("inspect", id.as_str(), call).await
    }

    async fn node_of(&self, id: &ContainerId) -> Result<Option<String>, RuntimeError> {
        let call = self.inner.node_of(id);
        self.read("inspect", id.as_str(), call).await
    }

    async fn probe_host(&self, id: &ContainerId, name: &str) -> Result<String, RuntimeError> {
        let call = self.inner.probe_host(id, name);
        self.read("inspect", id.as_str(), call).await
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        self.read("inspect", id.as_str(), self.inner.inspect(id))
            .await
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        let call = self.inner.remove(id, stop_timeout);
        let after = self.deadlines.call.saturating_add(stop_timeout);
        self.change("remove", "remove", id.as_str(), after, call)
            .await
    }

    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let call = self.inner.pause(id);
        let after = self.deadlines.call;
        self.change("pause", "pause", id.as_str(), after, call)
            .await
    }

    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let call = self.inner.unpause(id);
        let after = self.deadlines.call;
        self.change("unpause", "unpause", id.as_str(), after, call)
            .await
    }

    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError> {
        let call = self.inner.logs_tail(id, lines);
        self.read("logs", id.as_str(), call).await
    }

    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        let call = self.inner.pool_containers(deployment);
        self.read("list", deployment.as_str(), call).await
    }

    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        // A stream has no deadline and no fence: it is meant to stay open
        // and changes nothing. The watcher reconnects when it ends.
        self.inner.events(deployment, since)
    }
}

#[async_trait]
impl Networks for GuardedRuntime {
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        let call = self.inner.ensure_network(spec);
        let after = self.deadlines.call;
        self.change("network create", "network", &spec.name, after, call)
            .await
    }

    async fn remove_stale_bridges(&self) -> Result<Vec<StaleBridge>, RuntimeError> {
        let call = self.inner.remove_stale_bridges();
        let after = self.deadlines.call;
        self.change(
            "bridge removal",
            "remove stale bridges",
            "the host's bridges",
            after,
            call,
        )
        .await
    }

    async fn route_conflict(
        &self,
        id: &ContainerId,
    ) -> Result<Option<RouteConflict>, RuntimeError> {
        self.read("route check", id.as_str(), self.inner.route_conflict(id))
            .await
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let call = self.inner.networks(deployment);
        self.read("list networks", deployment.as_str(), call).await
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        let call = self.inner.remove_network(name, deployment);
        let after = self.deadlines.call;
        self.change("network remove", "remove network", name, after, call)
            .await
    }

    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        let call = self.inner.network_members(network);
        self.read("inspect network", network, call).await
    }

    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError> {
        let call = self.inner.attach_candidate(name);
        self.read("inspect", name, call).await
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        let call = self.inner.connect(network, container);
        let after = self.deadlines.call;
        self.change("network connect", "connect", container, after, call)
            .await
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        let call = self.inner.disconnect(network, container);
        let after = self.deadlines.call;
        self.change("network disconnect", "disconnect", container, after, call)
            .await
    }

    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError> {
        let call = self.inner.rejoin(network, id, aliases);
        let after = self.deadlines.call;
        self.change("network rejoin", "rejoin network", id.as_str(), after, call)
            .await
    }

    fn removed_networks(&self) -> NetworkStream {
        // As the event stream: open for good, its connect bounded by the
        // adapter.
        self.inner.removed_networks()
    }
}

#[async_trait]
impl Volumes for GuardedRuntime {
    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let call = self.inner.volumes(deployment);
        self.read("list volumes", deployment.as_str(), call).await
    }

    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError> {
        let call = self.inner.remove_volume(name, deployment, disks);
        let after = self.deadlines.call;
        self.change("volume remove", "remove volume", name, after, call)
            .await
    }

    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        let call = self.inner.run_template_job(job);
        let after = self.deadlines.job;
        self.change("template job", "template job", &job.name, after, call)
            .await
    }

    async fn fill_volume(
        &self,
        fill: &VolumeFill,
        content: FileContent,
    ) -> Result<(), RuntimeError> {
        // A seed's data file streams in from the state database: bounded
        // as a seed's load is.
        let call = self.inner.fill_volume(fill, content);
        let after = self.deadlines.call.max(crate::domain::seed::APPLY_TIMEOUT);
        self.change("volume fill", "fill volume", &fill.volume.name, after, call)
            .await
    }

    async fn start_helper(&self, helper: &Helper) -> Result<ContainerId, RuntimeError> {
        let call = self.inner.start_helper(helper);
        let after = self.deadlines.call;
        self.change("helper", "start helper", &helper.name, after, call)
            .await
    }
}

#[async_trait]
impl Images for GuardedRuntime {
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        let call = self.inner.image_labels(image);
        self.read("inspect image", image, call).await
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        let call = self.inner.image_id(image);
        self.read("inspect image", image, call).await
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        // Fetching an image changes no sandbox: not fenced. A pull that
        // takes too long leaves the image unavailable (not a timeout to
        // retry at once: the next try starts the pull again).
        let after = self.deadlines.pull;
        match tokio::time::timeout(after, self.inner.pull(image)).await {
            Ok(result) => result,
            Err(_) => Err(RuntimeError::ImageUnavailable {
                image: image.to_owned(),
                reason: format!("pull timed out after {after:?}"),
            }),
        }
    }
}

#[async_trait]
impl Commands for GuardedRuntime {
    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        // Setting up users and databases inside an engine changes it.
        let call = self.inner.exec(id, cmd, env);
        let after = self.deadlines.call;
        self.change("exec", "exec", id.as_str(), after, call).await
    }

    async fn filter(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
        input: ByteStream<'_>,
        keep: usize,
    ) -> Result<FilterOutput, RuntimeError> {
        // A seed's load into its engine (a change like any exec), which
        // streams the whole seed through: bounded as a seed's load is.
        let call = self.inner.filter(id, cmd, env, input, keep);
        let after = self.deadlines.call.max(crate::domain::seed::APPLY_TIMEOUT);
        self.change("exec", "exec", id.as_str(), after, call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lease::Term;
    use crate::testing::FakeRuntime;

    fn guarded_runtime(fence: &Fence) -> GuardedRuntime {
        let deadline = Duration::from_secs(3600);
        GuardedRuntime::new(
            Arc::new(FakeRuntime::default()),
            RuntimeDeadlines {
                call: deadline,
                pull: deadline,
                job: deadline,
            },
            fence.clone(),
            Arc::new(Metrics::new()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_under_way_when_the_lease_runs_out_is_given_up() {
        let fence = Fence::default();
        let rt = guarded_runtime(&fence);
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
        let rt = guarded_runtime(&fence);
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
        let rt = guarded_runtime(&fence);
        let result = rt
            .remove(&ContainerId::new("c"), Duration::from_secs(1))
            .await;
        assert!(matches!(result, Err(RuntimeError::Refused(m)) if m.contains("not the leader")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_does_not_answer_in_time_is_a_timeout_naming_the_call() {
        let fence = Fence::default();
        let rt = guarded_runtime(&fence);
        fence.grant(Term(1), Instant::now() + Duration::from_secs(86_400));
        let result = rt
            .change(
                "network remove",
                "remove network",
                "n",
                Duration::from_secs(5),
                std::future::pending::<Result<(), RuntimeError>>(),
            )
            .await;
        let e = result.unwrap_err();
        assert!(
            matches!(&e, RuntimeError::Timeout { op: "remove network", target, after }
                if target == "n" && *after == Duration::from_secs(5)),
            "{e}"
        );
    }
}
