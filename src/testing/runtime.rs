//! An in-memory container runtime.

use super::Faults;
use crate::domain::attach::{self, Candidate};
use crate::domain::container::{ContainerState, ExecOutput, ObservedContainer, RunState};
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::identity;
use crate::domain::labels;
use crate::domain::labels::ContainerLabels;
use crate::domain::pool::PooledContainer;
use crate::ports::runtime::{
    Capabilities, Commands, ContainerAction, ContainerSpec, Containers, DiskStore, EventStream,
    FileContent, Helper, Host, Images, NetworkSpec, NetworkStream, Networks, ObservedResource,
    RuntimeError, RuntimeEvent, TemplateJob, VolumeFill, Volumes,
};
use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use futures::channel::mpsc;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The runtime's operations, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RuntimeOp {
    Ping,
    List,
    Network,
    ImageLabels,
    Pull,
    TemplateJob,
    FillVolume,
    Create,
    Rename,
    PublishedPort,
    Inspect,
    Remove,
    Logs,
    Exec,
    Pause,
}

/// One fake container.
#[derive(Debug, Clone)]
pub(crate) struct FakeContainer {
    pub(crate) name: String,
    pub(crate) spec: ContainerSpec,
    pub(crate) labels: ContainerLabels,
    pub(crate) state: ContainerState,
    pub(crate) oom_killed: bool,
    /// How its process ended, once it did.
    pub(crate) exit_code: Option<i64>,
    pub(crate) created: DateTime<Utc>,
    pub(crate) host_port: u16,
    /// Frozen by `pause`: its exec (and so the fake engine's probe) fails.
    pub(crate) paused: bool,
    /// Client connections the fake engine reports (exec `clients`).
    pub(crate) clients: u32,
    /// A warm pool's container: it has no sandbox label (its `labels`
    /// name [`POOL_SANDBOX`]), a sandbox list does not show it, its events
    /// name no sandbox, and only a claim recorded in the state database
    /// says whose it is once claimed.
    pub(crate) pool: bool,
    /// The password its engine opens to now: the one it was started with
    /// (`SANDBOXD_PASSWORD` on its standard input), or a claimant's after
    /// the fake engine's claim.
    pub(crate) password: String,
    /// Networks it joined after it was created (a claimed pool container
    /// joins its sandbox's).
    pub(crate) joined: BTreeSet<String>,
    /// The data it started from (`start_from`: a fork's copy): the origin
    /// its volume held when it was created (empty: none); `None`: its
    /// engine initialised its own.
    pub(crate) started_from: Option<String>,
    /// The seed content its data holds: loaded into it (exec `seed`), or
    /// in the copy it started from.
    pub(crate) seed: Option<String>,
}

/// What a copy wrote into a volume: where the data comes from (see
/// [`FakeContainer::data_origin`]) and the seed it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Copied {
    pub(crate) origin: String,
    pub(crate) seed: Option<String>,
}

/// The sandbox a pool container's `labels` name (it has no sandbox label).
pub(crate) const POOL_SANDBOX: &str = "warm-pool";

impl FakeContainer {
    /// The sandbox its events name: none for a pool container.
    fn event_sandbox(&self) -> Option<SandboxId> {
        (!self.pool).then(|| self.labels.sandbox.clone())
    }

    /// Where its data comes from, as a copy of it records it: the sandbox
    /// and incarnation that wrote it (`SANDBOX@INCARNATION`; a pool
    /// container's, `pool:ID`, is whoever claimed it), then `<` and the
    /// origin of the data it started from, if it started from a copy.
    pub(crate) fn data_origin(&self, id: &ContainerId) -> String {
        let own = if self.pool {
            format!("{POOL_ORIGIN}{id}")
        } else {
            format!(
                "{}@{}",
                self.labels.sandbox,
                self.labels.incarnation.as_deref().unwrap_or("?")
            )
        };
        match &self.started_from {
            Some(from) => format!("{own}<{from}"),
            None => own,
        }
    }
}

/// Whether a volume that exists with `existing` labels was made for what
/// asks for it with `wanted` (it carries every one of them), as the
/// Docker adapter judges data to start from.
fn made_for(existing: &HashMap<String, String>, wanted: &HashMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| existing.get(k) == Some(v))
}

/// How a pool container's data origin starts: its claimant wrote it.
pub(crate) const POOL_ORIGIN: &str = "pool:";

/// The labels of a new container: a sandbox's as they are, a pool's with
/// [`POOL_SANDBOX`] for the sandbox it does not name yet.
fn labels_of(spec: &ContainerSpec) -> Option<(ContainerLabels, bool)> {
    let pool = spec
        .labels
        .get(crate::domain::pool::POOL)
        .map(String::as_str)
        == Some("1");
    if !pool {
        return ContainerLabels::parse(&spec.labels).map(|l| (l, false));
    }
    let mut map = spec.labels.clone();
    map.insert(labels::SANDBOX.to_owned(), POOL_SANDBOX.to_owned());
    map.insert(labels::GENERATION.to_owned(), "0".to_owned());
    ContainerLabels::parse(&map).map(|l| (l, true))
}

/// The password a container's standard input starts its engine with.
fn started_password(spec: &ContainerSpec) -> String {
    spec.stdin
        .as_ref()
        .and_then(|s| {
            s.expose()
                .lines()
                .find_map(|l| l.strip_prefix("SANDBOXD_PASSWORD="))
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

#[derive(Default)]
struct World {
    containers: BTreeMap<ContainerId, FakeContainer>,
    /// Where the orders this world's events report are recorded the
    /// moment they happen (a watcher quicker than any reconcile), if set.
    orders: Option<std::sync::Arc<crate::domain::death::Orders>>,
    /// Every command run with exec, in order.
    execs: Vec<(ContainerId, Vec<String>)>,
    /// What every container's cgroup says of its memory (used, cap), for
    /// a command that reads it; `None`: such a command prints nothing.
    memory: Option<(u64, u64)>,
    /// The containers of each sandbox and of each name (indexes of
    /// `containers`, so that a fleet of 100 000 lists in constant time).
    by_sandbox: HashMap<SandboxId, BTreeSet<ContainerId>>,
    by_name: HashMap<String, BTreeSet<ContainerId>>,
    by_network: HashMap<String, BTreeSet<ContainerId>>,
    missing_images: BTreeSet<String>,
    /// How often each image was built again under its reference (a new
    /// image id, see [`FakeRuntime::rebuild_image`]).
    rebuilds: BTreeMap<String, u32>,
    networks: BTreeMap<String, NetworkSpec>,
    volumes: BTreeMap<String, HashMap<String, String>>,
    /// Template jobs run.
    template_jobs: usize,
    /// Other containers (agents), by name.
    agents: BTreeMap<String, RunState>,
    /// Labels of every image (absent: no labels).
    image_labels: BTreeMap<String, HashMap<String, String>>,
    /// (network, container) pairs connected after creation.
    attached: BTreeSet<(String, String)>,
    /// What `attach_candidate` says of a name, where a test set it (see
    /// [`FakeRuntime::set_attach_candidate`]).
    candidates: BTreeMap<String, Option<Candidate>>,
    next: u32,
    /// Event streams, shared with the runtime (see [`FakeRuntime`]).
    subscribers: Subscribers<RuntimeEvent>,
    panic_listing: BTreeSet<SandboxId>,
    hang_creating: BTreeSet<SandboxId>,
    /// Engine containers cut off from their network (it was removed).
    detached: BTreeSet<(String, String)>,
    /// Whether the next create finds its network gone.
    lose_network: bool,
    network_subscribers: Subscribers<String>,
    /// Absent images a pull fetches, and how long it takes.
    pullable: BTreeMap<String, Duration>,
    /// Pulls asked for, by image.
    pulls: BTreeMap<String, u32>,
    /// What `host_memory` reports.
    host_memory: Option<u64>,
    /// What `oci_runtimes` reports.
    oci_runtimes: Option<Vec<String>>,
    /// Containers being removed (`docker rm -f` answered, the removal is
    /// not done): they keep their name until the number of looks
    /// (`inspect`) left here runs out.
    releasing: BTreeMap<ContainerId, u32>,
    /// Running helpers (a fork's copy), by id, each with when it exits
    /// (and Docker removes it) on its own.
    helpers: BTreeMap<ContainerId, (Helper, tokio::time::Instant)>,
    /// What a copy wrote into each volume, once one did.
    volume_data: BTreeMap<String, Copied>,
}

impl World {
    /// The id of `image` now: a new one each time it is rebuilt. The
    /// generation leads, so that the 12 digits a template's name keeps
    /// of it differ between generations.
    fn image_id(&self, image: &str) -> String {
        let generation = self.rebuilds.get(image).copied().unwrap_or(0);
        format!("sha256:{generation:02}fake-{image}")
    }

    /// Whether a container (whatever its state, as Docker counts) or a
    /// helper mounts the volume `name`.
    fn mounted(&self, name: &str) -> bool {
        let is = |v: Option<&crate::ports::runtime::Volume>| v.is_some_and(|v| v.name == name);
        self.containers.values().any(|c| {
            is(c.spec.volume.as_ref())
                || is(c.spec.start_from.as_ref())
                || is(c.spec.template.as_ref())
                || is(c.spec.binaries.as_ref())
        }) || self.helpers.values().any(|(h, _)| is(Some(&h.volume)))
    }

    /// Helpers past their lifetime exit and are removed, as Docker's
    /// `--rm` does (one sandboxd lost track of does not hold its volume).
    fn expire_helpers(&mut self) {
        let now = tokio::time::Instant::now();
        self.helpers.retain(|_, (_, until)| *until > now);
    }

    /// The networks `c` is on: its own, unless it was cut off from it
    /// (plus any it was connected to later).
    fn networks_of(&self, c: &FakeContainer) -> Vec<String> {
        let own = &c.spec.network;
        let mut on: Vec<String> = (self.networks.contains_key(own)
            && !self.detached.contains(&(own.clone(), c.name.clone())))
        .then(|| own.clone())
        .into_iter()
        .collect();
        on.extend(
            self.attached
                .iter()
                .filter(|(n, name)| name == &c.name && n != own)
                .map(|(n, _)| n.clone()),
        );
        on.extend(c.joined.iter().filter(|n| *n != own).cloned());
        on
    }

    fn add(&mut self, id: ContainerId, c: FakeContainer) {
        self.by_sandbox
            .entry(c.labels.sandbox.clone())
            .or_default()
            .insert(id.clone());
        self.by_name
            .entry(c.name.clone())
            .or_default()
            .insert(id.clone());
        self.by_network
            .entry(c.spec.network.clone())
            .or_default()
            .insert(id.clone());
        self.containers.insert(id, c);
    }

    fn take(&mut self, id: &ContainerId) -> Option<FakeContainer> {
        let c = self.containers.remove(id)?;
        unlist(&mut self.by_sandbox, &c.labels.sandbox, id);
        unlist(&mut self.by_name, &c.name, id);
        unlist(&mut self.by_network, &c.spec.network, id);
        Some(c)
    }

    fn named(&self, name: &str) -> Vec<ContainerId> {
        self.by_name
            .get(name)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Takes `id` out of `key`'s entry of an index.
fn unlist<K: std::hash::Hash + Eq>(
    index: &mut HashMap<K, BTreeSet<ContainerId>>,
    key: &K,
    id: &ContainerId,
) {
    if let Some(ids) = index.get_mut(key) {
        ids.remove(id);
        if ids.is_empty() {
            index.remove(key);
        }
    }
}

/// The open streams of one kind of event.
type Subscribers<T> = Arc<Mutex<Vec<mpsc::UnboundedSender<Result<T, RuntimeError>>>>>;

/// A runtime that keeps its containers in memory; every container "runs"
/// until killed, and answers its probe while it runs.
///
/// Subscribing to its events takes a lock of its own, not the world's: a
/// watcher starting while a list of a large fleet holds the world would
/// otherwise block its whole worker thread, where Docker answers both at
/// once.
pub(crate) struct FakeRuntime {
    world: Mutex<World>,
    subscribers: Subscribers<RuntimeEvent>,
    network_subscribers: Subscribers<String>,
    /// Faults to inject, by operation.
    pub(crate) faults: Faults<RuntimeOp>,
    full_lists: std::sync::atomic::AtomicU64,
    /// What it declares it can do (everything unless a test says less).
    pub(crate) capabilities: Mutex<Capabilities>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        let world = World::default();
        FakeRuntime {
            subscribers: world.subscribers.clone(),
            network_subscribers: world.network_subscribers.clone(),
            world: Mutex::new(world),
            faults: Faults::default(),
            full_lists: std::sync::atomic::AtomicU64::default(),
            capabilities: Mutex::new(Capabilities::ALL),
        }
    }
}

fn injected(op: &'static str, reason: String) -> RuntimeError {
    RuntimeError::Api {
        op,
        target: "fake".into(),
        source: reason.into(),
    }
}

impl FakeRuntime {
    /// Makes `image` absent (and unpullable).
    pub(crate) fn remove_image(&self, image: &str) {
        self.world
            .lock()
            .unwrap()
            .missing_images
            .insert(image.into());
    }

    /// Lets a pull of the absent `image` fetch it, taking `after`.
    pub(crate) fn publish_image(&self, image: &str, after: Duration) {
        self.world
            .lock()
            .unwrap()
            .pullable
            .insert(image.into(), after);
    }

    /// Builds `image` again under the same reference: it gets a new id
    /// (containers that run it keep the old one). Returns the id it had.
    pub(crate) fn rebuild_image(&self, image: &str) -> String {
        let mut w = self.world.lock().unwrap();
        let former = w.image_id(image);
        *w.rebuilds.entry(image.into()).or_default() += 1;
        former
    }

    /// The id `image` has now, present or not.
    pub(crate) fn image_id_now(&self, image: &str) -> String {
        self.world.lock().unwrap().image_id(image)
    }

    /// Removes, as an operator's `docker volume rm` would, the template
    /// (or binaries) volume `pick` lands on among those no container
    /// mounts: its name, if there was one.
    pub(crate) fn remove_template_from_outside(&self, pick: u64) -> Option<String> {
        use crate::domain::template_volume::{TEMPLATE, TEMPLATE_BINARIES};
        let mut w = self.world.lock().unwrap();
        let unused: Vec<String> = w
            .volumes
            .iter()
            .filter(|(_, l)| l.contains_key(TEMPLATE) || l.contains_key(TEMPLATE_BINARIES))
            .map(|(name, _)| name.clone())
            .filter(|name| !w.mounted(name))
            .collect();
        let name = unused
            .get((pick % unused.len().max(1) as u64) as usize)?
            .clone();
        w.volumes.remove(&name);
        Some(name)
    }

    /// How many template jobs succeeded.
    pub(crate) fn template_jobs(&self) -> usize {
        self.world.lock().unwrap().template_jobs
    }

    /// How many pulls of `image` were asked for.
    pub(crate) fn pulls_of(&self, image: &str) -> u32 {
        self.world
            .lock()
            .unwrap()
            .pulls
            .get(image)
            .copied()
            .unwrap_or(0)
    }

    /// Gives `image` these labels.
    pub(crate) fn label_image(&self, image: &str, labels: HashMap<String, String>) {
        self.world
            .lock()
            .unwrap()
            .image_labels
            .insert(image.into(), labels);
    }

    /// Makes a container that is not sandboxd's (an agent) exist with this
    /// state, or (`None`) vanish.
    pub(crate) fn set_agent(&self, name: &str, state: Option<RunState>) {
        let mut w = self.world.lock().unwrap();
        match state {
            Some(state) => w.agents.insert(name.into(), state),
            None => w.agents.remove(name),
        };
    }

    /// The owner whose sandboxes every agent opts in for, unless a test
    /// says otherwise (the controller tests' rows are this owner's).
    pub(crate) const AGENT_OWNER: &'static str = "test";

    /// Makes `attach_candidate(name)` answer `candidate`. Unset, a name
    /// starting with `missing-` resolves to nothing and any other to an
    /// agent of that name opted in for [`Self::AGENT_OWNER`].
    pub(crate) fn set_attach_candidate(&self, name: &str, candidate: Option<Candidate>) {
        self.world
            .lock()
            .unwrap()
            .candidates
            .insert(name.into(), candidate);
    }

    /// Ends every event stream, as a daemon restart does (watchers reconnect).
    /// Records every order this world's events report in `orders` at
    /// once, sandboxd's own removals included: the event watcher at its
    /// quickest, ahead of the reconcile that caused them.
    pub(crate) fn report_orders_to(&self, orders: std::sync::Arc<crate::domain::death::Orders>) {
        self.world.lock().unwrap().orders = Some(orders);
    }

    pub(crate) fn cut_events(&self) {
        self.subscribers.lock().unwrap().clear();
        self.network_subscribers.lock().unwrap().clear();
    }

    /// Makes the next create find its network gone (removed between the
    /// reconcile's check and the create).
    /// Sets the host memory the daemon reports.
    pub(crate) fn set_host_memory(&self, bytes: Option<u64>) {
        self.world.lock().unwrap().host_memory = bytes;
    }

    /// Sets the OCI runtimes the daemon reports (until then it does not
    /// say, and creates under any runtime succeed).
    pub(crate) fn set_oci_runtimes(&self, runtimes: &[&str]) {
        self.world.lock().unwrap().oci_runtimes =
            Some(runtimes.iter().map(|s| (*s).to_owned()).collect());
    }

    pub(crate) fn lose_network_at_next_create(&self) {
        self.world.lock().unwrap().lose_network = true;
    }

    /// Whether the network `name` exists.
    pub(crate) fn has_network(&self, name: &str) -> bool {
        self.world.lock().unwrap().networks.contains_key(name)
    }

    /// Names of the volumes that exist.
    pub(crate) fn volume_names(&self) -> Vec<String> {
        self.world.lock().unwrap().volumes.keys().cloned().collect()
    }

    /// Makes the volume `name` exist with `labels` (made by someone else).
    pub(crate) fn put_volume(&self, name: &str, labels: HashMap<String, String>) {
        self.world
            .lock()
            .unwrap()
            .volumes
            .insert(name.to_owned(), labels);
    }

    /// The labels of the volume `name`, if it exists.
    pub(crate) fn volume_labels(&self, name: &str) -> Option<HashMap<String, String>> {
        self.world.lock().unwrap().volumes.get(name).cloned()
    }

    /// Sets the label `key` of a container to `value`, as if another
    /// controller had created it so.
    pub(crate) fn set_label(&self, id: &ContainerId, key: &str, value: &str) {
        let mut w = self.world.lock().unwrap();
        let mut c = w.take(id).expect("the container exists");
        c.spec.labels.insert(key.to_owned(), value.to_owned());
        c.labels = ContainerLabels::parse(&c.spec.labels).expect("well-formed labels");
        w.add(id.clone(), c);
    }

    /// Makes listing `sandbox`'s containers panic (a bug in one reconcile).
    pub(crate) fn panic_when_listing(&self, sandbox: &SandboxId) {
        self.world
            .lock()
            .unwrap()
            .panic_listing
            .insert(sandbox.clone());
    }

    /// Makes creating `sandbox`'s containers hang (a stuck Docker call).
    pub(crate) fn hang_when_creating(&self, sandbox: &SandboxId) {
        self.world
            .lock()
            .unwrap()
            .hang_creating
            .insert(sandbox.clone());
    }

    /// Every container, by id.
    /// Runs `f` over the containers as they are, without copying them
    /// (the simulation's oracle looks after every step).
    pub(crate) fn with_containers<T>(
        &self,
        f: impl FnOnce(&BTreeMap<ContainerId, FakeContainer>) -> T,
    ) -> T {
        f(&self.world.lock().unwrap().containers)
    }

    /// The container `id`, if it exists.
    pub(crate) fn container(&self, id: &ContainerId) -> Option<FakeContainer> {
        self.world.lock().unwrap().containers.get(id).cloned()
    }

    pub(crate) fn containers(&self) -> BTreeMap<ContainerId, FakeContainer> {
        self.world.lock().unwrap().containers.clone()
    }

    /// Makes every container's cgroup report `used` bytes of a `cap`.
    pub(crate) fn set_memory(&self, used: u64, cap: u64) {
        self.world.lock().unwrap().memory = Some((used, cap));
    }

    /// Every command run with exec (container, argv), in order.
    pub(crate) fn execs(&self) -> Vec<(ContainerId, Vec<String>)> {
        self.world.lock().unwrap().execs.clone()
    }

    /// The containers of `sandbox`.
    pub(crate) fn containers_of(&self, sandbox: &SandboxId) -> Vec<(ContainerId, FakeContainer)> {
        let w = self.world.lock().unwrap();
        w.by_sandbox
            .get(sandbox)
            .into_iter()
            .flatten()
            .map(|id| (id.clone(), w.containers[id].clone()))
            .collect()
    }

    /// How many times the whole deployment was listed (a `list` without a
    /// sandbox); [`Faults::calls`] counts every `list`.
    /// Makes the fake engine in `id` report `n` client connections.
    pub(crate) fn set_clients(&self, id: &ContainerId, n: u32) {
        if let Some(c) = self.world.lock().unwrap().containers.get_mut(id) {
            c.clients = n;
        }
    }

    pub(crate) fn full_lists(&self) -> u64 {
        self.full_lists.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Removes a container as `docker rm -f` does on a busy host: it is
    /// killed and listed as being removed at once, but keeps its name
    /// (a create or rename of that name meets
    /// [`RuntimeError::NameBeingRemoved`]) until it has been inspected
    /// `looks` times more; then it is gone.
    pub(crate) fn remove_slowly(&self, id: &ContainerId, looks: u32) {
        let mut w = self.world.lock().unwrap();
        let sandbox = w.containers.get_mut(id).and_then(|c| {
            c.state = ContainerState::Removing;
            c.paused = false;
            c.event_sandbox()
        });
        w.releasing.insert(id.clone(), looks);
        emit(&mut w, id, ContainerAction::Kill, sandbox.clone());
        emit(&mut w, id, ContainerAction::Die, sandbox);
    }

    /// Stops a container as if its process died on its own (exit code
    /// 1), or was OOM-killed if `oom`: only `die` is reported.
    pub(crate) fn kill(&self, id: &ContainerId, oom: bool) {
        let mut w = self.world.lock().unwrap();
        let sandbox = w.containers.get_mut(id).and_then(|c| {
            c.state = ContainerState::Exited;
            c.paused = false;
            c.oom_killed = oom;
            c.exit_code = Some(if oom { 137 } else { 1 });
            c.event_sandbox()
        });
        emit(&mut w, id, ContainerAction::Die, sandbox);
    }

    /// `docker kill`: the API reports `kill`, then the process's `die`.
    pub(crate) fn kill_from_outside(&self, id: &ContainerId) {
        let mut w = self.world.lock().unwrap();
        let sandbox = w.containers.get_mut(id).and_then(|c| {
            c.state = ContainerState::Exited;
            c.paused = false;
            c.exit_code = Some(137);
            c.event_sandbox()
        });
        emit(&mut w, id, ContainerAction::Kill, sandbox.clone());
        emit(&mut w, id, ContainerAction::Die, sandbox);
    }
}

/// The fake engine's claim (exec `claim` with `FAKEDB_POOL_PASSWORD` and
/// `FAKEDB_PASSWORD`): a running pool container that opens to the pool
/// password opens to the claimant's afterwards, and to nothing else.
fn claim(w: &mut World, id: &ContainerId, env: &[String]) -> ExecOutput {
    let var = |name: &str| {
        env.iter()
            .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    let (pool, claimant) = (var("FAKEDB_POOL_PASSWORD"), var("FAKEDB_PASSWORD"));
    let c = w.containers.get_mut(id).filter(|c| {
        c.pool
            && c.state == ContainerState::Running
            && !c.paused
            && pool.as_deref() == Some(c.password.as_str())
    });
    match (c, claimant) {
        (Some(c), Some(claimant)) => {
            c.password = claimant;
            ExecOutput {
                exit_code: 0,
                output: String::new(),
            }
        }
        _ => ExecOutput {
            exit_code: 1,
            output: "the pool password does not open it".to_owned(),
        },
    }
}

/// A command in a helper: the fake engine's fork copy (`bash -c
/// fakedb-fork sandboxd-fork copy DATA TARGET`) writes the origin of the
/// data of the container the helper sees into the helper's volume; it
/// fails if that container no longer runs (its PID namespace is gone).
fn helper_exec(w: &mut World, helper: &Helper, cmd: &[&str]) -> ExecOutput {
    let copy = matches!(cmd, ["bash", "-c", script, "sandboxd-fork", "copy", ..] if *script == super::engine::FORK_SCRIPT);
    let source = w
        .containers
        .get(&helper.sees)
        .filter(|c| c.state == ContainerState::Running);
    match (copy, source) {
        (true, Some(c)) => {
            let copied = Copied {
                origin: c.data_origin(&helper.sees),
                seed: c.seed.clone(),
            };
            w.volume_data.insert(helper.volume.name.clone(), copied);
            ExecOutput {
                exit_code: 0,
                output: "size=4096\n".to_owned(),
            }
        }
        _ => ExecOutput {
            exit_code: 1,
            output: "the helper sees no running container".to_owned(),
        },
    }
}

/// The fake engine's seed load (exec `seed` with `FAKEDB_SEED`): a
/// running container holds the seed afterwards, unless its content says
/// `fail` (a seed whose statements fail) or is a data file (only a start
/// can load one, as Redis an RDB file).
fn load_seed(w: &mut World, id: &ContainerId, env: &[String]) -> ExecOutput {
    let content = env.iter().find_map(|e| e.strip_prefix("FAKEDB_SEED="));
    let c = w
        .containers
        .get_mut(id)
        .filter(|c| c.state == ContainerState::Running && !c.paused);
    match (c, content) {
        (Some(_), Some(content)) if content.starts_with(FAILING_SEED) => ExecOutput {
            exit_code: 1,
            output: "the seed's statements fail".to_owned(),
        },
        (Some(_), Some(content)) if content.as_bytes().starts_with(super::engine::DATA_FILE) => {
            ExecOutput {
                exit_code: 1,
                output: "a data file is no statements".to_owned(),
            }
        }
        (Some(c), Some(content)) => {
            c.seed = Some(content.to_owned());
            ExecOutput {
                exit_code: 0,
                output: String::new(),
            }
        }
        _ => ExecOutput {
            exit_code: 1,
            output: "not running".to_owned(),
        },
    }
}

/// How the content of a seed the fake engine cannot load begins.
pub(crate) const FAILING_SEED: &str = "fail";

fn emit(w: &mut World, id: &ContainerId, action: ContainerAction, sandbox: Option<SandboxId>) {
    if let (Some(orders), Some(order)) = (&w.orders, action.order()) {
        orders.record(id, order);
    }
    let event = RuntimeEvent {
        container: id.clone(),
        action,
        sandbox,
        time: None,
    };
    w.subscribers
        .lock()
        .unwrap()
        .retain(|tx| tx.unbounded_send(Ok(event.clone())).is_ok());
}

#[async_trait]
impl Host for FakeRuntime {
    fn capabilities(&self) -> Capabilities {
        *self.capabilities.lock().unwrap()
    }

    async fn host_memory(&self) -> Result<Option<u64>, RuntimeError> {
        Ok(self.world.lock().unwrap().host_memory)
    }

    async fn oci_runtimes(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        Ok(self.world.lock().unwrap().oci_runtimes.clone())
    }

    async fn ping(&self) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Ping)
            .await
            .map_err(|e| RuntimeError::Connect(e.into()))
    }
}

#[async_trait]
impl Containers for FakeRuntime {
    async fn list(
        &self,
        deployment: &Deployment,
        sandbox: Option<&SandboxId>,
    ) -> Result<Vec<ObservedContainer>, RuntimeError> {
        if let Some(id) = sandbox {
            if self.world.lock().unwrap().panic_listing.contains(id) {
                panic!("injected panic listing {id}");
            }
        }
        self.faults
            .check(RuntimeOp::List)
            .await
            .map_err(|e| injected("list", e))?;
        if sandbox.is_none() {
            self.full_lists
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let w = self.world.lock().unwrap();
        let ids: Box<dyn Iterator<Item = &ContainerId>> = match sandbox {
            Some(s) => Box::new(w.by_sandbox.get(s).into_iter().flatten()),
            None => Box::new(w.containers.keys()),
        };
        Ok(ids
            .map(|id| (id, &w.containers[id]))
            .filter(|(_, c)| !c.pool && &c.labels.deployment == deployment)
            .map(|(id, c)| ObservedContainer {
                id: id.clone(),
                name: c.name.clone(),
                labels: c.labels.clone(),
                state: c.state,
                created: c.created,
                host_port: Some(c.host_port),
                networks: w.networks_of(c),
                paused: c.paused,
            })
            .collect())
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<ContainerId, RuntimeError> {
        self.faults
            .check(RuntimeOp::Create)
            .await
            .map_err(|e| injected("create", e))?;
        let (labels, pool) =
            labels_of(spec).ok_or_else(|| injected("create", "malformed labels".into()))?;
        let hang = self
            .world
            .lock()
            .unwrap()
            .hang_creating
            .contains(&labels.sandbox);
        if hang {
            std::future::pending::<()>().await;
        }
        let mut w = self.world.lock().unwrap();
        // As dockerd: a runtime it does not have is refused at the create.
        if let (Some(runtime), Some(known)) = (&spec.runtime, &w.oci_runtimes) {
            if !known.contains(runtime) {
                return Err(injected(
                    "create",
                    format!("unknown or invalid runtime name: {runtime}"),
                ));
            }
        }
        if std::mem::take(&mut w.lose_network) {
            w.networks.remove(&spec.network);
        }
        if !w.networks.contains_key(&spec.network) {
            return Err(RuntimeError::NetworkGone {
                network: spec.network.clone(),
            });
        }
        w.detached.retain(|(_, c)| c != &spec.name);
        let taken = w.named(&spec.name);
        // As the Docker adapter: never another state database's container,
        // never another incarnation's data.
        if taken
            .iter()
            .any(|id| !identity::may_replace(&w.containers[id].spec.labels, &spec.labels))
        {
            return Err(RuntimeError::Refused(format!(
                "the container name {} is taken by another state database's container",
                spec.name
            )));
        }
        if let Some(holder) = taken.iter().find(|id| w.releasing.contains_key(id)) {
            return Err(RuntimeError::NameBeingRemoved {
                name: spec.name.clone(),
                holder: holder.clone(),
            });
        }
        if let Some(v) = &spec.volume {
            if let Some(existing) = w.volumes.get(&v.name) {
                if !identity::may_mount(existing, &v.labels) {
                    return Err(RuntimeError::Refused(format!(
                        "volume {} holds another incarnation's data",
                        v.name
                    )));
                }
            }
        }
        // As the Docker adapter: a template must exist, its labels proving
        // what it holds.
        for t in spec.template.iter().chain(&spec.binaries) {
            use crate::domain::template_volume::{judge, Verdict};
            match w.volumes.get(&t.name) {
                Some(existing) if judge(existing, &t.labels) == Verdict::Reuse => {}
                Some(_) => {
                    return Err(RuntimeError::Refused(format!(
                        "template volume {} exists but its labels do not prove its content",
                        t.name
                    )))
                }
                None => {
                    return Err(RuntimeError::Refused(format!(
                        "template volume {} is gone",
                        t.name
                    )))
                }
            }
        }
        // As the Docker adapter: data to start from must exist, made for
        // this (its labels).
        let started_from = match &spec.start_from {
            Some(v) => match w.volumes.get(&v.name) {
                Some(existing) if made_for(existing, &v.labels) => {
                    Some(w.volume_data.get(&v.name).cloned().unwrap_or(Copied {
                        origin: String::new(),
                        seed: None,
                    }))
                }
                Some(_) => {
                    return Err(RuntimeError::Refused(format!(
                        "volume {} exists but was not made for this",
                        v.name
                    )))
                }
                None => return Err(RuntimeError::Refused(format!("volume {} is gone", v.name))),
            },
            None => None,
        };
        for id in taken {
            w.take(&id);
        }
        if let Some(v) = &spec.volume {
            w.volumes
                .entry(v.name.clone())
                .or_insert_with(|| v.labels.clone());
        }
        w.next += 1;
        let id = ContainerId::new(format!("fake{:04}", w.next));
        let host_port = spec.host_port.unwrap_or(40_000 + w.next as u16);
        let c = FakeContainer {
            name: spec.name.clone(),
            spec: spec.clone(),
            labels,
            state: ContainerState::Running,
            oom_killed: false,
            exit_code: None,
            created: Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap(),
            host_port,
            paused: false,
            clients: 0,
            pool,
            password: started_password(spec),
            joined: BTreeSet::new(),
            seed: started_from.as_ref().and_then(|c| c.seed.clone()),
            started_from: started_from.map(|c| c.origin),
        };
        let sandbox = c.event_sandbox();
        w.add(id.clone(), c);
        emit(&mut w, &id, ContainerAction::Create, sandbox.clone());
        emit(&mut w, &id, ContainerAction::Start, sandbox);
        Ok(id)
    }

    async fn rename(&self, id: &ContainerId, name: &str) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Rename)
            .await
            .map_err(|e| injected("rename", e))?;
        let mut w = self.world.lock().unwrap();
        if let Some(holder) = w
            .named(name)
            .into_iter()
            .find(|other| other != id && w.releasing.contains_key(other))
        {
            return Err(RuntimeError::NameBeingRemoved {
                name: name.to_owned(),
                holder,
            });
        }
        if w.named(name).iter().any(|other| other != id) {
            return Err(injected("rename", format!("the name {name} is in use")));
        }
        let mut c = w
            .take(id)
            .ok_or_else(|| injected("rename", format!("no container {id}")))?;
        c.name = name.to_owned();
        c.spec.name = name.to_owned();
        w.add(id.clone(), c);
        Ok(())
    }

    async fn published_port(&self, id: &ContainerId) -> Result<Option<u16>, RuntimeError> {
        self.faults
            .check(RuntimeOp::PublishedPort)
            .await
            .map_err(|e| injected("inspect", e))?;
        Ok(self
            .world
            .lock()
            .unwrap()
            .containers
            .get(id)
            .map(|c| c.host_port))
    }

    async fn inspect(&self, id: &ContainerId) -> Result<Option<RunState>, RuntimeError> {
        self.faults
            .check(RuntimeOp::Inspect)
            .await
            .map_err(|e| injected("inspect", e))?;
        let mut w = self.world.lock().unwrap();
        if let Some(looks) = w.releasing.get_mut(id) {
            *looks = looks.saturating_sub(1);
            if *looks == 0 {
                w.releasing.remove(id);
                if let Some(c) = w.take(id) {
                    emit(&mut w, id, ContainerAction::Destroy, c.event_sandbox());
                }
                return Ok(None);
            }
        }
        let sandboxd = w
            .containers
            .get(id)
            .or_else(|| w.containers.values().find(|c| c.name == id.as_str()))
            .map(|c| RunState {
                running: c.state == ContainerState::Running,
                oom_killed: c.oom_killed,
                finished_at: None,
                exit_code: c.exit_code,
            });
        Ok(sandboxd.or_else(|| w.agents.get(id.as_str()).copied()))
    }

    async fn pause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Pause)
            .await
            .map_err(|e| injected("pause", e))?;
        let mut w = self.world.lock().unwrap();
        match w.containers.get_mut(id) {
            Some(c) if c.state == ContainerState::Running => {
                c.paused = true;
                Ok(())
            }
            _ => Err(injected("pause", format!("container {id} is not running"))),
        }
    }

    async fn unpause(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Pause)
            .await
            .map_err(|e| injected("unpause", e))?;
        if let Some(c) = self.world.lock().unwrap().containers.get_mut(id) {
            c.paused = false;
        }
        Ok(())
    }

    async fn remove(&self, id: &ContainerId, _stop_timeout: Duration) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Remove)
            .await
            .map_err(|e| injected("remove", e))?;
        let mut w = self.world.lock().unwrap();
        if w.releasing.contains_key(id) {
            // Docker: "removal already in progress" (the adapter's success).
            return Ok(());
        }
        if let Some(c) = w.take(id) {
            emit(&mut w, id, ContainerAction::Destroy, c.event_sandbox());
        }
        w.helpers.remove(id);
        Ok(())
    }

    async fn logs_tail(&self, _id: &ContainerId, _lines: usize) -> Result<String, RuntimeError> {
        self.faults
            .check(RuntimeOp::Logs)
            .await
            .map_err(|e| injected("logs", e))?;
        Ok("fake log line".into())
    }

    async fn pool_containers(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<PooledContainer>, RuntimeError> {
        self.faults
            .check(RuntimeOp::List)
            .await
            .map_err(|e| injected("list", e))?;
        let w = self.world.lock().unwrap();
        Ok(w.containers
            .iter()
            .filter(|(_, c)| c.pool)
            .filter_map(|(id, c)| {
                let seen = crate::domain::pool::Seen {
                    id: id.clone(),
                    name: c.name.clone(),
                    state: c.state,
                    paused: c.paused,
                    created: c.created,
                    host_port: Some(c.host_port),
                    networks: w.networks_of(c),
                };
                PooledContainer::from_labels(&c.spec.labels, deployment, seen)
            })
            .collect())
    }

    fn events(&self, _deployment: &Deployment, _since: Option<i64>) -> EventStream {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers.lock().unwrap().push(tx);
        rx.boxed()
    }
}

#[async_trait]
impl Networks for FakeRuntime {
    async fn ensure_network(&self, spec: &NetworkSpec) -> Result<bool, RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("network", e))?;
        let mut w = self.world.lock().unwrap();
        if w.networks.contains_key(&spec.name) {
            return Ok(false);
        }
        w.networks.insert(spec.name.clone(), spec.clone());
        Ok(true)
    }

    async fn networks(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("list networks", e))?;
        let w = self.world.lock().unwrap();
        Ok(w.networks
            .values()
            .filter_map(|n| ObservedResource::of(n.name.clone(), &n.labels, deployment))
            .collect())
    }

    async fn remove_network(
        &self,
        name: &str,
        deployment: &Deployment,
    ) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("remove network", e))?;
        let mut w = self.world.lock().unwrap();
        let Some(network) = w.networks.get(name) else {
            return Ok(());
        };
        if !labels::belongs_to(&network.labels, deployment) {
            return Err(RuntimeError::Refused(format!(
                "network {name} is not {deployment}'s"
            )));
        }
        w.networks.remove(name);
        w.attached.retain(|(n, _)| n != name);
        for c in w.containers.values_mut() {
            c.joined.remove(name);
        }
        let cut: Vec<(String, String)> = w
            .containers
            .values()
            .filter(|c| c.spec.network == name)
            .map(|c| (name.to_owned(), c.name.clone()))
            .collect();
        w.detached.extend(cut);
        w.network_subscribers
            .lock()
            .unwrap()
            .retain(|tx| tx.unbounded_send(Ok(name.to_owned())).is_ok());
        Ok(())
    }

    async fn network_members(&self, network: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("inspect network", e))?;
        let w = self.world.lock().unwrap();
        if !w.networks.contains_key(network) {
            return Ok(None);
        }
        let mut members: Vec<String> = (w.by_network.get(network).into_iter().flatten())
            .map(|id| &w.containers[id])
            .filter(|c| !w.detached.contains(&(network.to_owned(), c.name.clone())))
            .map(|c| c.name.clone())
            .collect();
        members.extend(
            w.attached
                .iter()
                .filter(|(n, _)| n == network)
                .map(|(_, c)| c.clone()),
        );
        members.extend(
            w.containers
                .values()
                .filter(|c| c.joined.contains(network))
                .map(|c| c.name.clone()),
        );
        Ok(Some(members))
    }

    async fn attach_candidate(&self, name: &str) -> Result<Option<Candidate>, RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("inspect", e))?;
        let w = self.world.lock().unwrap();
        if let Some(set) = w.candidates.get(name) {
            return Ok(set.clone());
        }
        if name.starts_with("missing-") {
            return Ok(None);
        }
        // An agent's id is its name here (as `set_agent`'s are).
        Ok(Some(Candidate {
            id: ContainerId::new(name),
            name: name.to_owned(),
            labels: HashMap::from([(attach::OPT_IN.to_owned(), Self::AGENT_OWNER.to_owned())]),
            holds: attach::Holds::default(),
        }))
    }

    async fn connect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("connect", e))?;
        let mut w = self.world.lock().unwrap();
        if !w.networks.contains_key(network) {
            return Err(injected("connect", format!("no network {network}")));
        }
        if container.starts_with("missing-") {
            return Err(RuntimeError::Refused(format!(
                "container {container} (in attach) does not exist"
            )));
        }
        w.attached
            .insert((network.to_owned(), container.to_owned()));
        Ok(())
    }

    async fn disconnect(&self, network: &str, container: &str) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("disconnect", e))?;
        self.world
            .lock()
            .unwrap()
            .attached
            .remove(&(network.to_owned(), container.to_owned()));
        Ok(())
    }

    /// Like Docker: the port is bound anew, to another host port unless
    /// the container asked for a fixed one.
    async fn rejoin(
        &self,
        network: &str,
        id: &ContainerId,
        aliases: &[String],
    ) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::Network)
            .await
            .map_err(|e| injected("rejoin", e))?;
        let mut w = self.world.lock().unwrap();
        if !w.networks.contains_key(network) {
            return Err(injected("rejoin", format!("no network {network}")));
        }
        w.next += 1;
        let port = 40_000 + w.next as u16;
        // As Docker: disconnected (if it was on it) and connected again.
        let c = w
            .containers
            .get_mut(id)
            .ok_or_else(|| injected("rejoin", format!("no container {id}")))?;
        if c.spec.network != network {
            c.joined.insert(network.to_owned());
        }
        c.spec.aliases = aliases.to_vec();
        c.host_port = c.spec.host_port.unwrap_or(port);
        let name = c.name.clone();
        w.detached.remove(&(network.to_owned(), name));
        Ok(())
    }

    fn removed_networks(&self) -> NetworkStream {
        let (tx, rx) = mpsc::unbounded();
        self.network_subscribers.lock().unwrap().push(tx);
        rx.boxed()
    }
}

#[async_trait]
impl Volumes for FakeRuntime {
    async fn volumes(
        &self,
        deployment: &Deployment,
    ) -> Result<Vec<ObservedResource>, RuntimeError> {
        let w = self.world.lock().unwrap();
        Ok(w.volumes
            .iter()
            .filter_map(|(name, labels)| ObservedResource::of(name.clone(), labels, deployment))
            .collect())
    }

    async fn remove_volume(
        &self,
        name: &str,
        deployment: &Deployment,
        _disks: Option<&DiskStore>,
    ) -> Result<(), RuntimeError> {
        let mut w = self.world.lock().unwrap();
        w.expire_helpers();
        let Some(labels) = w.volumes.get(name) else {
            return Ok(());
        };
        if !labels::belongs_to(labels, deployment) {
            return Err(RuntimeError::Refused(format!(
                "volume {name} is not {deployment}'s"
            )));
        }
        if w.mounted(name) {
            return Err(injected(
                "remove volume",
                format!("volume {name} is in use"),
            ));
        }
        w.volumes.remove(name);
        w.volume_data.remove(name);
        Ok(())
    }

    /// As the Docker adapter: the helper of the same name replaced, its
    /// volume created if missing and refused if another's.
    async fn start_helper(&self, helper: &Helper) -> Result<ContainerId, RuntimeError> {
        self.faults
            .check(RuntimeOp::Create)
            .await
            .map_err(|e| injected("create", e))?;
        let mut w = self.world.lock().unwrap();
        w.expire_helpers();
        let v = &helper.volume;
        if let Some(existing) = w.volumes.get(&v.name) {
            if !identity::may_mount(existing, &v.labels) {
                return Err(RuntimeError::Refused(format!(
                    "volume {} exists but was not created for this sandbox",
                    v.name
                )));
            }
        }
        w.helpers.retain(|_, (h, _)| h.name != helper.name);
        w.volumes
            .entry(v.name.clone())
            .or_insert_with(|| v.labels.clone());
        w.next += 1;
        let id = ContainerId::new(format!("fake{:04}", w.next));
        let until = tokio::time::Instant::now() + helper.lifetime;
        w.helpers.insert(id.clone(), (helper.clone(), until));
        Ok(id)
    }

    async fn run_template_job(&self, job: &TemplateJob) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::TemplateJob)
            .await
            .map_err(|e| injected("template job", e))?;
        let mut w = self.world.lock().unwrap();
        for volume in std::iter::once(&job.volume).chain(&job.binaries) {
            // As the Docker adapter: reuse what the labels prove, replace
            // this deployment's other templates unless mounted, refuse the
            // rest.
            if let Some(existing) = w.volumes.get(&volume.name) {
                use crate::domain::template_volume::{judge, Refusal, Verdict};
                let refused = |refusal| RuntimeError::TemplateRefused {
                    volume: volume.name.clone(),
                    refusal,
                    deployment: existing.get(labels::DEPLOYMENT).cloned(),
                    sandbox: existing.get(labels::SANDBOX).cloned(),
                };
                match judge(existing, &volume.labels) {
                    Verdict::Reuse => continue,
                    Verdict::Refuse(refusal) => return Err(refused(refusal)),
                    Verdict::Replace => {
                        if w.mounted(&volume.name) {
                            return Err(refused(Refusal::InUse));
                        }
                    }
                }
            }
            w.volumes.insert(volume.name.clone(), volume.labels.clone());
        }
        w.template_jobs += 1;
        Ok(())
    }

    /// As the Docker adapter: the volume is created with its labels (one
    /// that exists must carry them) and holds the file; a container that
    /// starts from it holds its content as its seed.
    async fn fill_volume(
        &self,
        fill: &VolumeFill,
        content: FileContent,
    ) -> Result<(), RuntimeError> {
        self.faults
            .check(RuntimeOp::FillVolume)
            .await
            .map_err(|e| injected("fill volume", e))?;
        let volume = &fill.volume;
        if let Some(existing) = self.world.lock().unwrap().volumes.get(&volume.name) {
            if !made_for(existing, &volume.labels) {
                return Err(RuntimeError::Refused(format!(
                    "volume {} exists but was not made for this",
                    volume.name
                )));
            }
        }
        let mut bytes = Vec::new();
        let mut chunks = content.chunks;
        while let Some(chunk) = chunks.next().await {
            bytes.extend_from_slice(&chunk.map_err(|e| RuntimeError::Api {
                op: "fill volume",
                target: volume.name.clone(),
                source: e.to_string().into(),
            })?);
        }
        if bytes.len() as u64 != content.len {
            return Err(RuntimeError::Refused(format!(
                "volume {}: {} of {} bytes arrived",
                volume.name,
                bytes.len(),
                content.len
            )));
        }
        let mut w = self.world.lock().unwrap();
        w.volumes
            .entry(volume.name.clone())
            .or_insert_with(|| volume.labels.clone());
        w.volume_data.insert(
            volume.name.clone(),
            Copied {
                origin: format!("file:{}", volume.name),
                seed: Some(String::from_utf8_lossy(&bytes).into_owned()),
            },
        );
        Ok(())
    }
}

#[async_trait]
impl Images for FakeRuntime {
    async fn image_labels(
        &self,
        image: &str,
    ) -> Result<Option<HashMap<String, String>>, RuntimeError> {
        self.faults
            .check(RuntimeOp::ImageLabels)
            .await
            .map_err(|e| injected("inspect image", e))?;
        let w = self.world.lock().unwrap();
        Ok((!w.missing_images.contains(image))
            .then(|| w.image_labels.get(image).cloned().unwrap_or_default()))
    }

    async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        self.faults
            .check(RuntimeOp::ImageLabels)
            .await
            .map_err(|e| injected("inspect image", e))?;
        let w = self.world.lock().unwrap();
        Ok((!w.missing_images.contains(image)).then(|| w.image_id(image)))
    }

    async fn pull(&self, image: &str) -> Result<(), RuntimeError> {
        *self
            .world
            .lock()
            .unwrap()
            .pulls
            .entry(image.into())
            .or_default() += 1;
        self.faults
            .check(RuntimeOp::Pull)
            .await
            .map_err(|e| injected("pull", e))?;
        let takes = self.world.lock().unwrap().pullable.get(image).copied();
        let Some(takes) = takes else {
            return Err(RuntimeError::ImageUnavailable {
                image: image.into(),
                reason: "no registry in the fake".into(),
            });
        };
        tokio::time::sleep(takes).await;
        self.world.lock().unwrap().missing_images.remove(image);
        Ok(())
    }
}

#[async_trait]
impl Commands for FakeRuntime {
    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError> {
        self.faults
            .check(RuntimeOp::Exec)
            .await
            .map_err(|e| injected("exec", e))?;
        let mut w = self.world.lock().unwrap();
        w.execs
            .push((id.clone(), cmd.iter().map(|s| (*s).to_owned()).collect()));
        w.expire_helpers();
        if let Some((helper, _)) = w.helpers.get(id).cloned() {
            return Ok(helper_exec(&mut w, &helper, cmd));
        }
        // A paused container runs nothing.
        let container = w
            .containers
            .get(id)
            .filter(|c| c.state == ContainerState::Running && !c.paused);
        let running = container.is_some();
        if cmd.first() == Some(&"claim") {
            return Ok(claim(&mut w, id, &env));
        }
        if cmd.first() == Some(&"seed") {
            return Ok(load_seed(&mut w, id, &env));
        }
        if cmd.first() == Some(&"clients") {
            return Ok(match container {
                Some(c) => ExecOutput {
                    exit_code: 0,
                    output: c.clients.to_string(),
                },
                None => ExecOutput {
                    exit_code: 1,
                    output: String::new(),
                },
            });
        }
        // `echo WORDS...` prints its words; `false` fails: enough for the
        // fake engine's checkpoint commands.
        let memory = w.memory;
        let (exit_code, output) = match cmd {
            ["echo", words @ ..] if running => (0, format!("{}\n", words.join(" "))),
            ["sh", "-c", script] if running && script.contains("/sys/fs/cgroup") => (
                0,
                memory.map_or_else(String::new, |(used, cap)| format!("{used} {cap}\n")),
            ),
            ["false", words @ ..] => (1, words.join(" ")),
            _ => (if running { 0 } else { 1 }, String::new()),
        };
        Ok(ExecOutput { exit_code, output })
    }
}
