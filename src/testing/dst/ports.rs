//! One simulated process's view of the world: the runtime and the store as
//! the controller calls them, each call perturbed by the world's dice (it
//! fails, hangs, is slow, or happens on the server and reports failure),
//! every list possibly answered from an older view, every event possibly
//! dropped, doubled or held back. A process that crashed reaches nothing
//! any more; a frozen one waits. Each change that reaches the world is
//! checked against the oracle ([`super::world::World`]) first.

use super::world::World;
use crate::domain::attach::Candidate;
use crate::domain::breaker::ReapingState;
use crate::domain::checkpoint::{Outcome, Work};
use crate::domain::container::{ExecOutput, ObservedContainer, RunState};
use crate::domain::identity::StateId;
use crate::domain::lease::{LeaseHolder, Term};
use crate::domain::pool::PooledContainer;
use crate::domain::sandbox::{DesiredSandbox, SandboxStatus};
use crate::domain::status::StatusUpdate;
use crate::domain::{ContainerId, Deployment, SandboxId};
use crate::ports::runtime::*;
use crate::ports::store::*;
use crate::testing::{FakeRuntime, FakeStore};
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// One controller process: its name (the lease holder) and whether it
/// still runs.
#[derive(Debug)]
pub(crate) struct Process {
    pub(crate) holder: String,
    dead: AtomicBool,
    frozen_until: Mutex<Option<Instant>>,
    /// Crash once this many more calls have reached the world (0: no
    /// such crash planned): a crash between a write and its answer.
    crash_after: std::sync::atomic::AtomicU64,
}

impl Process {
    pub(crate) fn new(holder: String) -> Arc<Self> {
        Arc::new(Self {
            holder,
            dead: AtomicBool::new(false),
            frozen_until: Mutex::new(None),
            crash_after: Default::default(),
        })
    }

    /// The process is gone: nothing it started reaches the world again.
    pub(crate) fn crash(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// The process crashes right after its `calls`-th next call reached
    /// the world, before that call answers.
    pub(crate) fn crash_after(&self, calls: u64) {
        self.crash_after.store(calls, Ordering::SeqCst);
    }

    /// Counts one call that reached the world; never returns if that was
    /// the one to crash after.
    async fn reached(&self, world: &World) {
        let left = self.crash_after.load(Ordering::SeqCst);
        if left == 0 {
            return;
        }
        self.crash_after.store(left - 1, Ordering::SeqCst);
        if left == 1 {
            world.trace(format_args!("{} crashes before the answer", self.holder));
            self.crash();
            std::future::pending::<()>().await;
        }
    }

    /// A call that takes `latency` (none: it goes on in the same poll).
    async fn slow(&self, latency: Duration) {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
            self.gate().await;
        }
    }

    /// Nothing of the process reaches the world until `until`.
    pub(crate) fn freeze(&self, until: Instant) {
        *self.frozen_until.lock().unwrap() = Some(until);
    }

    /// Waits while the process is frozen; forever once it crashed.
    async fn gate(&self) {
        loop {
            if self.is_dead() {
                std::future::pending::<()>().await;
            }
            let until = *self.frozen_until.lock().unwrap();
            match until {
                Some(t) if Instant::now() < t => tokio::time::sleep_until(t).await,
                _ => return,
            }
        }
    }

    /// What the world does to one of this process's calls, in this order
    /// (every seed's draws depend on it): wait while frozen, `announce`
    /// it, draw its fate and latency (`change`: it may be a lie), take the
    /// latency, fail or hang if so fated, run `admit` (a change's checks),
    /// make the call, count it as reached (a crash may follow), and answer
    /// `fail()` for a change the world made but lies about.
    async fn perturbed<T, E>(
        &self,
        world: &World,
        change: bool,
        announce: impl FnOnce(),
        fail: impl Fn() -> E,
        admit: impl FnOnce(),
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.gate().await;
        announce();
        let (fate, latency) = world.fate(change);
        self.slow(latency).await;
        match fate {
            Fate::Fail => return Err(fail()),
            Fate::Hang => std::future::pending::<()>().await,
            Fate::Through | Fate::Lie => {}
        }
        admit();
        let result = call.await;
        self.reached(world).await;
        match fate {
            Fate::Lie if result.is_ok() => Err(fail()),
            _ => result,
        }
    }
}

/// What the dice decided for one call.
enum Fate {
    Through,
    Fail,
    Hang,
    /// Done on the server, reported as failed.
    Lie,
}

/// The process's runtime.
pub(crate) struct SimRuntime {
    pub(crate) world: Arc<World>,
    pub(crate) process: Arc<Process>,
    /// The full lists this process saw last, newest last (a stale list is
    /// one of these).
    seen: Mutex<Vec<Vec<ObservedContainer>>>,
}

/// The process's store.
pub(crate) struct SimStore {
    pub(crate) world: Arc<World>,
    pub(crate) process: Arc<Process>,
}

impl SimRuntime {
    pub(crate) fn new(world: Arc<World>, process: Arc<Process>) -> Self {
        Self {
            world,
            process,
            seen: Mutex::new(Vec::new()),
        }
    }

    fn fake(&self) -> &FakeRuntime {
        &self.world.runtime
    }

    /// Runs `call` as the world lets it: `op` names it in the trace and in
    /// an injected error; `check` runs just before a change reaches the
    /// world (None for a read).
    async fn call<T>(
        &self,
        op: &'static str,
        target: &str,
        check: Option<&(dyn Fn() + Sync)>,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        let world = &self.world;
        let holder = &self.process.holder;
        self.process
            .perturbed(
                world,
                check.is_some(),
                || {
                    if world.debug {
                        world.trace(format_args!("{holder} call {op} {target}"));
                    }
                },
                || RuntimeError::Api {
                    op,
                    target: target.to_owned(),
                    source: "simulated failure".into(),
                },
                || {
                    if let Some(check) = check {
                        world.check_leader(&self.process.holder, op, target);
                        check();
                        world.trace(format_args!("{holder} {op} {target}"));
                    }
                },
                call,
            )
            .await
    }

    async fn change<T>(
        &self,
        op: &'static str,
        target: &str,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        self.call(op, target, Some(&|| {}), call).await
    }

    async fn read<T>(
        &self,
        op: &'static str,
        target: &str,
        call: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        self.call(op, target, None, call).await
    }
}

/// Calls to `SimStore` that write (traced, and perturbed as changes).
impl SimStore {
    async fn call<T>(
        &self,
        op: &'static str,
        write: bool,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let world = &self.world;
        self.process
            .perturbed(
                world,
                write,
                || {
                    if world.debug {
                        world.trace(format_args!("{} store {op}", self.process.holder));
                    }
                },
                || StoreError::Query {
                    op,
                    source: "simulated failure".into(),
                },
                || {},
                call,
            )
            .await
    }

    fn fake(&self) -> &FakeStore {
        &self.world.store
    }
}

impl World {
    /// The dice for one call: its fate and how long it takes.
    fn fate(&self, change: bool) -> (Fate, Duration) {
        let mut rng = self.rng.lock().unwrap();
        // One call in four takes a while: enough to interleave reconciles
        // every way, while most calls cost no timer.
        let latency = if rng.chance(250) {
            rng.millis(40)
        } else {
            Duration::ZERO
        };
        if self.calm() || !self.switches.call_faults {
            return (Fate::Through, latency);
        }
        let fate = match rng.below(1000) {
            0..=14 => Fate::Fail,
            15..=17 => Fate::Hang,
            18..=27 if change && self.switches.lies => Fate::Lie,
            _ => Fate::Through,
        };
        (fate, latency)
    }
}

#[async_trait]
impl Host for SimRuntime {
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.read("ping", "daemon", self.fake().ping()).await
    }

    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        self.read("info", "daemon", self.fake().host_memory()).await
    }

    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        self.read("info", "daemon", self.fake().oci_runtimes())
            .await
    }
}

#[async_trait]
impl Containers for SimRuntime {
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        let now = self
            .read(
                "list",
                deployment.as_str(),
                self.fake().list(deployment, sandbox),
            )
            .await?;
        if sandbox.is_some() {
            return Ok(now);
        }
        // A full list may answer from a view up to `STALE_VIEWS` lists old.
        let mut seen = self.seen.lock().unwrap();
        seen.push(now.clone());
        if seen.len() > super::STALE_VIEWS {
            seen.remove(0);
        }
        let stale = !self.world.calm() && self.world.switches.stale_lists && {
            let mut rng = self.world.rng.lock().unwrap();
            rng.chance(100)
        };
        if stale {
            let back = self.world.rng.lock().unwrap().below(seen.len() as u64) as usize;
            if self.world.debug {
                let age = seen.len() - 1 - back;
                self.world.trace(format_args!(
                    "{} list answered {age} lists old",
                    self.process.holder
                ));
            }
            return Ok(seen[back].clone());
        }
        Ok(now)
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        let world = self.world.clone();
        let created = self
            .change("create", &spec.name, async {
                let id = self.fake().create_and_start(spec).await?;
                world.created(&self.process.holder, &id, spec);
                world.pool_started(&self.process.holder, spec);
                Ok(id)
            })
            .await;
        created
    }

    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        self.change("rename", id.as_str(), self.fake().rename(id, name))
            .await
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        self.read("port", id.as_str(), self.fake().published_port(id))
            .await
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        self.read("inspect", id.as_str(), self.fake().inspect(id))
            .await
    }

    async fn remove(&self, id: &ContainerId, stop_timeout: Duration) -> Result<(), RuntimeError> {
        // Whether the row was there is judged when the removal leaves the
        // controller (after any freeze), not when it lands.
        self.process.gate().await;
        let sent_while_wanted = self.world.wants(id);
        let world = self.world.clone();
        let process = self.process.clone();
        let check = move || world.check_remove(&process.holder, id, sent_while_wanted);
        self.call(
            "remove",
            id.as_str(),
            Some(&check),
            self.fake().remove(id, stop_timeout),
        )
        .await
    }

    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.change("pause", id.as_str(), self.fake().pause(id))
            .await
    }

    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.change("unpause", id.as_str(), self.fake().unpause(id))
            .await
    }

    async fn logs_tail(&self, id: &ContainerId, lines: usize) -> Result<String, RuntimeError> {
        self.read("logs", id.as_str(), self.fake().logs_tail(id, lines))
            .await
    }

    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        self.read(
            "pool",
            deployment.as_str(),
            self.fake().pool_containers(deployment),
        )
        .await
    }

    fn events(&self, deployment: &Deployment, since: Option<i64>) -> EventStream {
        let inner = self.fake().events(deployment, since);
        let world = self.world.clone();
        let process = self.process.clone();
        perturbed(inner, world, process)
    }
}

#[async_trait]
impl Networks for SimRuntime {
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        self.change(
            "network-create",
            &spec.name,
            self.fake().ensure_network(spec),
        )
        .await
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        self.read(
            "networks",
            deployment.as_str(),
            self.fake().networks(deployment),
        )
        .await
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        self.change(
            "network-remove",
            name,
            self.fake().remove_network(name, deployment),
        )
        .await
    }

    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        self.read(
            "network-members",
            network,
            self.fake().network_members(network),
        )
        .await
    }

    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError> {
        self.read("attach-candidate", name, self.fake().attach_candidate(name))
            .await
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.change(
            "connect",
            container,
            self.fake().connect(network, container),
        )
        .await
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.change(
            "disconnect",
            container,
            self.fake().disconnect(network, container),
        )
        .await
    }

    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError> {
        self.change(
            "rejoin",
            id.as_str(),
            self.fake().rejoin(network, id, aliases),
        )
        .await
    }

    fn removed_networks(&self) -> NetworkStream {
        let inner = self.fake().removed_networks();
        let process = self.process.clone();
        inner
            .then(move |item| {
                let process = process.clone();
                async move {
                    process.gate().await;
                    item
                }
            })
            .boxed()
    }
}

#[async_trait]
impl Volumes for SimRuntime {
    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        self.read(
            "volumes",
            deployment.as_str(),
            self.fake().volumes(deployment),
        )
        .await
    }

    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError> {
        self.change(
            "volume-remove",
            name,
            self.fake().remove_volume(name, deployment, disks),
        )
        .await
    }

    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        self.change("template-job", &job.name, self.fake().run_template_job(job))
            .await
    }

    async fn start_helper(&self, helper: &Helper) -> Result<ContainerId, RuntimeError> {
        self.change("helper", &helper.name, self.fake().start_helper(helper))
            .await
    }

    async fn fill_volume(
        &self,
        fill: &VolumeFill,
        content: FileContent,
    ) -> Result<(), RuntimeError> {
        self.change(
            "fill-volume",
            &fill.volume.name,
            self.fake().fill_volume(fill, content),
        )
        .await
    }
}

#[async_trait]
impl Images for SimRuntime {
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        self.read("image-labels", image, self.fake().image_labels(image))
            .await
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        self.read("image-id", image, self.fake().image_id(image))
            .await
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        self.read("pull", image, self.fake().pull(image)).await
    }
}

#[async_trait]
impl Commands for SimRuntime {
    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        // Probes are execs too: not traced (they change nothing), but
        // fenced like every exec, so checked against the lease. A claim
        // (the fake engine's, through exec) is judged by the oracle.
        let claim = cmd.first() == Some(&"claim");
        let world = &self.world;
        let holder = &self.process.holder;
        self.process
            .perturbed(
                world,
                false,
                || {},
                || RuntimeError::Api {
                    op: "exec",
                    target: id.to_string(),
                    source: "simulated failure".into(),
                },
                || {
                    world.check_leader(&self.process.holder, "exec", id.as_str());
                    if claim {
                        world.serving_claim(holder, id);
                        world.trace(format_args!("{holder} claim {id}"));
                    }
                },
                async {
                    let out = self.fake().exec(id, cmd, env).await?;
                    if claim && out.exit_code == 0 {
                        world.served_claim(id);
                    }
                    Ok(out)
                },
            )
            .await
    }
}

/// The event stream as the world delivers it: each event may be dropped,
/// doubled, or held back behind the next one (and so reordered), and comes
/// a little late; a crashed process hears nothing.
fn perturbed(inner: EventStream, world: Arc<World>, process: Arc<Process>) -> EventStream {
    struct State {
        inner: EventStream,
        held: Option<RuntimeEventResult>,
        out: std::collections::VecDeque<RuntimeEventResult>,
        world: Arc<World>,
        process: Arc<Process>,
    }
    type RuntimeEventResult = Result<RuntimeEvent, RuntimeError>;
    let state = State {
        inner,
        held: None,
        out: Default::default(),
        world,
        process,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(next) = s.out.pop_front() {
                s.process.gate().await;
                if s.world.debug {
                    let event = next.as_ref().ok().map(|e| (&e.container, e.action));
                    s.world
                        .trace(format_args!("{} event {event:?}", s.process.holder));
                }
                return Some((next, s));
            }
            let item = match s.inner.next().await {
                Some(item) => item,
                // The stream ended (cut): what was held back is lost with it.
                None => return None,
            };
            let (roll, delay) = {
                let mut rng = s.world.rng.lock().unwrap();
                (rng.below(1000), rng.millis(200))
            };
            tokio::time::sleep(delay).await;
            if s.world.calm() || !s.world.switches.event_faults {
                s.out.extend(s.held.take());
                s.out.push_back(item);
                continue;
            }
            match roll {
                // Dropped.
                0..=49 => {}
                // Doubled.
                50..=99 => {
                    if let Ok(e) = &item {
                        s.out.push_back(Ok(e.clone()));
                    }
                    s.out.push_back(item);
                }
                // Held back behind the next one.
                100..=149 if s.held.is_none() => s.held = Some(item),
                _ => {
                    s.out.push_back(item);
                    s.out.extend(s.held.take());
                }
            }
        }
    })
    .boxed()
}

#[async_trait]
impl Store for SimStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.call("ping", false, self.fake().ping()).await
    }
    async fn state_id(&self) -> Result<StateId, StoreError> {
        self.call("state_id", false, self.fake().state_id()).await
    }
    async fn fetch_desired(&self, id: &SandboxId) -> Result<Option<DesiredSandbox>, StoreError> {
        self.call("fetch_desired", false, self.fake().fetch_desired(id))
            .await
    }
    async fn fetch_status(&self, id: &SandboxId) -> Result<Option<SandboxStatus>, StoreError> {
        self.call("fetch_status", false, self.fake().fetch_status(id))
            .await
    }
    async fn list_desired(&self) -> Result<Vec<DesiredSandbox>, StoreError> {
        self.call("list_desired", false, self.fake().list_desired())
            .await
    }
    async fn desired_ids(&self) -> Result<Vec<String>, StoreError> {
        self.call("desired_ids", false, self.fake().desired_ids())
            .await
    }
    async fn mark_used(
        &self,
        id: &SandboxId,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
        self.call("mark_used", true, self.fake().mark_used(id, at))
            .await
    }
    async fn released_ids(&self, keep: Duration) -> Result<Vec<String>, StoreError> {
        self.call("released_ids", false, self.fake().released_ids(keep))
            .await
    }
    async fn reaping(&self) -> Result<ReapingState, StoreError> {
        self.call("reaping", false, self.fake().reaping()).await
    }
    async fn pause_reaping(&self, reason: &str) -> Result<(), StoreError> {
        self.call("pause_reaping", true, self.fake().pause_reaping(reason))
            .await
    }
    async fn list_status(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        self.call("list_status", false, self.fake().list_status())
            .await
    }
    async fn list_status_redacted(&self) -> Result<Vec<SandboxStatus>, StoreError> {
        self.call(
            "list_status_redacted",
            false,
            self.fake().list_status_redacted(),
        )
        .await
    }
    async fn write_status(
        &self,
        id: &SandboxId,
        update: &StatusUpdate,
        term: Term,
    ) -> Result<(), StoreError> {
        let world = self.world.clone();
        let holder = self.process.holder.clone();
        self.call("write_status", true, async move {
            self.fake().write_status(id, update, term).await?;
            world.published(&holder, id, update);
            Ok(())
        })
        .await
    }
    async fn delete_status(&self, id: &SandboxId, term: Term) -> Result<(), StoreError> {
        self.call("delete_status", true, self.fake().delete_status(id, term))
            .await
    }
    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<Option<Term>, StoreError> {
        self.call(
            "acquire_lease",
            true,
            self.fake().acquire_lease(holder, duration),
        )
        .await
    }
    async fn renew_lease(
        &self,
        holder: &str,
        term: Term,
        duration: Duration,
    ) -> Result<bool, StoreError> {
        self.call(
            "renew_lease",
            true,
            self.fake().renew_lease(holder, term, duration),
        )
        .await
    }
    async fn release_lease(&self, holder: &str, term: Term) -> Result<(), StoreError> {
        self.call(
            "release_lease",
            true,
            self.fake().release_lease(holder, term),
        )
        .await
    }
    async fn lease(&self) -> Result<Option<LeaseHolder>, StoreError> {
        self.call("lease", false, self.fake().lease()).await
    }
    async fn seed(
        &self,
        hash: &crate::domain::seed::SeedHash,
    ) -> Result<Option<crate::domain::seed::SeedInfo>, StoreError> {
        self.call("seed", false, self.fake().seed(hash)).await
    }
    async fn seed_chunk(
        &self,
        hash: &crate::domain::seed::SeedHash,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let call = self.fake().seed_chunk(hash, offset, len);
        self.call("seed_chunk", false, call).await
    }
    async fn pool_claims(&self) -> Result<Vec<crate::domain::pool::PoolClaim>, StoreError> {
        self.call("pool_claims", false, self.fake().pool_claims())
            .await
    }
    async fn record_claim(
        &self,
        claim: &crate::domain::pool::PoolClaim,
        term: Term,
    ) -> Result<(), StoreError> {
        let world = self.world.clone();
        let holder = self.process.holder.clone();
        self.call("record_claim", true, async move {
            self.fake().record_claim(claim, term).await?;
            world.claim_recorded(&holder, claim);
            world.trace(format_args!(
                "{holder} claim of {} recorded for {}",
                claim.container, claim.sandbox
            ));
            Ok(())
        })
        .await
    }
    async fn delete_claim(&self, container: &ContainerId, term: Term) -> Result<(), StoreError> {
        self.call(
            "delete_claim",
            true,
            self.fake().delete_claim(container, term),
        )
        .await
    }
    async fn record_events(
        &self,
        batch: EventBatch<'_>,
        term: Term,
    ) -> Result<Vec<crate::domain::notice::EventNotice>, StoreError> {
        self.call(
            "record_events",
            true,
            self.fake().record_events(batch, term),
        )
        .await
    }
    async fn prune_events(&self, age: Duration) -> Result<u64, StoreError> {
        self.call("prune_events", true, self.fake().prune_events(age))
            .await
    }
    async fn prune_seeds(&self, unnamed_for: Duration) -> Result<u64, StoreError> {
        self.call("prune_seeds", true, self.fake().prune_seeds(unnamed_for))
            .await
    }
    async fn checkpoint_work(&self, id: &SandboxId) -> Result<Work, StoreError> {
        self.call("checkpoint_work", false, self.fake().checkpoint_work(id))
            .await
    }
    async fn pending_work(&self) -> Result<Vec<SandboxId>, StoreError> {
        self.call("pending_work", false, self.fake().pending_work())
            .await
    }
    async fn notify_queue(&self) -> Result<crate::ports::store::NotifyQueue, StoreError> {
        self.call("notify_queue", false, self.fake().notify_queue())
            .await
    }
    async fn finish_checkpoint(
        &self,
        id: &SandboxId,
        name: &str,
        request: i64,
        outcome: &Outcome,
        term: Term,
    ) -> Result<(), StoreError> {
        self.call(
            "finish_checkpoint",
            true,
            self.fake()
                .finish_checkpoint(id, name, request, outcome, term),
        )
        .await
    }
    async fn finish_reset(
        &self,
        request: i64,
        outcome: Result<(), &str>,
        term: Term,
    ) -> Result<(), StoreError> {
        self.call(
            "finish_reset",
            true,
            self.fake().finish_reset(request, outcome, term),
        )
        .await
    }
    async fn watch_desired(&self) -> Result<NotifyStream, StoreError> {
        let inner = self
            .call("watch_desired", false, self.fake().watch_desired())
            .await?;
        let process = self.process.clone();
        let world = self.world.clone();
        // Notifications are hints: the world may drop one.
        Ok(inner
            .filter_map(move |item| {
                let process = process.clone();
                let world = world.clone();
                async move {
                    process.gate().await;
                    let drop = !world.calm()
                        && world.switches.event_faults
                        && world.rng.lock().unwrap().chance(50);
                    if world.debug {
                        let item = item.as_ref().ok();
                        world.trace(format_args!(
                            "{} notify {item:?} drop {drop}",
                            process.holder
                        ));
                    }
                    (!drop).then_some(item)
                }
            })
            .boxed())
    }
    async fn owner_quota(
        &self,
        owner: &str,
    ) -> Result<crate::domain::admission::Quota, StoreError> {
        self.call("owner_quota", false, self.fake().owner_quota(owner))
            .await
    }
}
