//! Deterministic simulation: whole controllers (wired exactly as `sandboxd
//! run` wires them) in a world of fakes where one seed decides everything:
//! the workload an orchestrator and an operator put on them, the faults of
//! every Docker and Postgres call, what happens to containers behind their
//! backs, when a process crashes, freezes or gets a rival, and the order in
//! which all of it interleaves. Time is tokio's paused clock; randomness
//! is the seed's ([`crate::domain::entropy`]); every `select!` of the
//! controller is biased; so a seed replays byte for byte.
//!
//! After every step the oracle ([`world::World`]) checks the invariants;
//! once the faults stop, every wanted sandbox must be ready, and nothing
//! else left, within [`LIVENESS_BOUND`] of simulated time. A failing seed is
//! shrunk to the fewest workload steps that still fail and printed with
//! the command that replays it. `docs/simulation.md` says what the world
//! models and what only the real-Docker suites prove.

mod ports;
mod regressions;
mod rng;
mod world;

pub use self::regressions::{OPEN, REGRESSIONS};
pub use crate::domain::mutation::Mutation;

use self::ports::{Process, SimRuntime, SimStore};
use self::rng::SimRng;
use self::world::World;
use crate::config::{ControllerConfig, PoolDemand};
use crate::controller::Controller;
use crate::domain::clock::Clock;
use crate::domain::fork::ForkOf;
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::pool::PoolKey;
use crate::domain::sandbox::{DesiredSandbox, IdleAction};
use crate::domain::ContainerId;
use crate::metrics::Metrics;
use crate::ports::runtime::{Containers as _, Networks as _};
use crate::testing::store::seed_hash;
use crate::testing::{FakeEngine, TEMPLATED_FAKE_ENGINES};
use chrono::{DateTime, TimeZone, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::domain::mutation;

/// How many earlier full lists a stale list may answer from.
pub(crate) const STALE_VIEWS: usize = 4;
/// How long, in simulated time after the faults stop, every wanted
/// sandbox has to be ready and everything unwanted gone: the longest
/// crash-loop back-off (60 s), the grace (30 s), a relist (10 s) and a
/// lease that has to run out (15 s), with room to spare.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(300);
/// How long a (sandbox, engine) may have a second live container (a
/// rotation under way, or what a create that reported failure left) before
/// that breaks the one-container invariant: a world may leave it without a
/// working leader for minutes (a frozen leader's lease, a clock jump, a
/// crash of each new process), and a heal's back-off comes on top.
pub const EXCESS_BOUND: Duration = Duration::from_secs(240);
/// Events each simulated sandbox keeps.
const EVENTS_KEPT: u32 = 10;
/// The grace window of the simulated controllers.
const GRACE: Duration = Duration::from_secs(30);
/// The configured warm pool's size.
const POOL_SIZE: usize = 2;
/// The most containers the pools learned from demand hold together.
const LEARNED_POOLS: usize = 3;
/// How long a sandbox that pauses when idle (every fourth id) goes
/// without a request or a touch before it is paused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// The owner of every third id, which may hold [`QUOTA`] sandboxes at
/// once (the others' owner is unlimited).
const CAPPED: &str = "capped";
/// See [`CAPPED`].
const QUOTA: u64 = 2;
/// A seed the fake engine loads.
const GOOD_SEED: &[u8] = b"insert into t values (1)";
/// A seed that is a data file (it begins with
/// [`crate::testing::engine::DATA_FILE`]): written into a volume new
/// containers start from, never sent as statements.
const DATA_FILE_SEED: &[u8] = b"FAKEDATA t=1";
/// A seed the fake engine cannot load (it begins with
/// [`crate::testing::runtime::FAILING_SEED`]); a warm pool of it is
/// configured, so that its back-off is exercised in every world.
const FAILING_SEED: &[u8] = b"fail: select 1/0";

/// The perturbations, each on its own switch (all on by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// Full lists answer from a view up to [`STALE_VIEWS`] lists old.
    pub stale_lists: bool,
    /// Events and notifications are dropped, doubled, delayed and
    /// reordered; the event stream is cut.
    pub event_faults: bool,
    /// Calls fail or hang past their deadline.
    pub call_faults: bool,
    /// Changes happen on the server and report failure to the caller.
    pub lies: bool,
    /// Containers die, are OOM-killed, removed, paused or renamed behind
    /// the controller's back; networks vanish.
    pub out_of_band: bool,
    /// The controller process crashes (at whatever await it is in) and a
    /// new one starts.
    pub crashes: bool,
    /// A second controller runs beside the first; one is frozen past its
    /// lease and resumes; the clock jumps.
    pub rivals: bool,
    /// The desired table is restored to an older copy, or emptied.
    pub restores: bool,
}

impl Default for Switches {
    fn default() -> Self {
        Self {
            stale_lists: true,
            event_faults: true,
            call_faults: true,
            lies: true,
            out_of_band: true,
            crashes: true,
            rivals: true,
            restores: true,
        }
    }
}

/// One world's shape.
#[derive(Debug, Clone)]
pub struct Options {
    /// The perturbations on.
    pub switches: Switches,
    /// A deliberately broken controller (see [`Mutation`]).
    pub mutation: Option<Mutation>,
    /// Workload steps.
    pub steps: usize,
    /// Sandbox ids the workload draws from.
    pub sandboxes: usize,
    /// Only these workload steps run (a shrunk trace); `None`: all.
    pub only: Option<BTreeSet<usize>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            switches: Switches::default(),
            mutation: None,
            steps: 200,
            sandboxes: 24,
            only: None,
        }
    }
}

/// What one world did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed that made the world.
    pub seed: u64,
    /// Every workload step and every change that reached the world, with
    /// its simulated time: the same seed gives the same bytes.
    pub trace: String,
    /// The first invariant broken, if one was.
    pub failure: Option<Failure>,
}

/// An invariant broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The workload step after which it was found (`steps`: in the
    /// liveness phase).
    pub step: usize,
    /// Which invariant, and what happened.
    pub what: String,
}

impl Failure {
    /// The invariant's name.
    pub fn invariant(&self) -> &str {
        self.what.split(':').next().unwrap_or("")
    }
}

/// One thing the orchestrator, the operator or the world does.
#[derive(Debug, Clone)]
enum Step {
    /// Insert or update a row (an update may grow its features). A new
    /// row names a seed: none (0), the good one (1), the failing one (2)
    /// or the data file (3).
    Put {
        sandbox: usize,
        features: u8,
        seed: u8,
    },
    Release {
        sandbox: usize,
    },
    /// Fork the row `pick` lands on into the new row `sandbox`
    /// (`sandbox_fork`).
    Fork {
        sandbox: usize,
        pick: u64,
    },
    Truncate,
    /// The orchestrator touches the row (`sandbox_touch`): a use, which
    /// resumes a paused sandbox.
    Touch {
        sandbox: usize,
    },
    Checkpoint {
        sandbox: usize,
    },
    Reset {
        sandbox: usize,
    },
    Kill {
        pick: u64,
        oom: bool,
    },
    KillFromOutside {
        pick: u64,
    },
    RemoveFromOutside {
        pick: u64,
    },
    PauseFromOutside {
        pick: u64,
    },
    RenameFromOutside {
        pick: u64,
    },
    NetworkGone {
        pick: u64,
    },
    /// The engine's plain (`features` false) or extended image is built
    /// again under its reference: it gets a new id.
    ImageRebuilt {
        features: bool,
    },
    /// An operator removes a template (or binaries) volume no container
    /// mounts (`docker volume rm`).
    TemplateGone {
        pick: u64,
    },
    CutEvents,
    /// A process crashes now (wherever it is), or right after its
    /// `after_calls`-th next call reached the world.
    Crash {
        pick: u64,
        after_calls: u64,
    },
    Rival,
    Freeze {
        pick: u64,
        seconds: u64,
    },
    Jump {
        seconds: u64,
    },
    Snapshot,
    Restore {
        empty: bool,
    },
    /// Nothing happens but time: timers fire, relists run, leases renew.
    Pass,
}

/// The workload of `seed`: steps and the simulated time after each.
fn plan(seed: u64, o: &Options) -> Vec<(Step, Duration)> {
    let mut r = SimRng::new(seed ^ 0x5EED_5EED_5EED_5EED);
    let s = o.switches;
    let n = o.sandboxes as u64;
    (0..o.steps)
        .map(|_| {
            let step = loop {
                let sandbox = r.below(n) as usize;
                let pick = r.next_u64();
                let step = match r.below(100) {
                    0..=29 => Step::Put {
                        sandbox,
                        features: r.below(4) as u8,
                        seed: match r.below(10) {
                            0..=6 => 0,
                            7 => 1,
                            8 => 3,
                            _ => 2,
                        },
                    },
                    30..=41 => Step::Release { sandbox },
                    42..=44 => Step::Checkpoint { sandbox },
                    45..=46 => Step::Reset { sandbox },
                    47 => Step::Truncate,
                    48..=53 if s.out_of_band => Step::Kill {
                        pick,
                        oom: r.chance(300),
                    },
                    54..=58 if s.out_of_band => Step::KillFromOutside { pick },
                    59..=61 if s.out_of_band => Step::RemoveFromOutside { pick },
                    62..=63 if s.out_of_band => Step::PauseFromOutside { pick },
                    64..=65 if s.out_of_band => Step::RenameFromOutside { pick },
                    66 if s.out_of_band => Step::NetworkGone { pick },
                    67..=68 if s.event_faults => Step::CutEvents,
                    69..=71 if s.crashes => Step::Crash {
                        pick,
                        after_calls: if r.chance(500) { 0 } else { 1 + r.below(30) },
                    },
                    72..=73 if s.rivals => Step::Rival,
                    74 if s.rivals => Step::Freeze {
                        pick,
                        seconds: 5 + r.below(40),
                    },
                    75 if s.rivals => Step::Jump {
                        seconds: 1 + r.below(60),
                    },
                    76 if s.restores => Step::Snapshot,
                    77 if s.restores => Step::Restore {
                        empty: r.chance(300),
                    },
                    78..=80 => Step::Fork { sandbox, pick },
                    81..=83 => Step::Touch { sandbox },
                    84 if s.out_of_band && pick % 3 == 0 => Step::ImageRebuilt {
                        features: pick % 2 == 0,
                    },
                    85 if s.out_of_band => Step::TemplateGone { pick },
                    84..=99 => Step::Pass,
                    // A perturbation switched off: draw again.
                    _ => continue,
                };
                break step;
            };
            (step, r.millis(2_000))
        })
        .collect()
}

/// When every world begins, on the simulated wall clock.
fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap()
}

/// The simulated wall clock: a fixed start plus tokio's paused time.
struct SimClock {
    at: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl Clock for SimClock {
    fn now(&self) -> DateTime<Utc> {
        self.at + chrono::Duration::from_std(self.start.elapsed()).expect("a short world")
    }
}

/// The controllers of one world.
struct Processes {
    world: Arc<World>,
    clock: Arc<SimClock>,
    config: ControllerConfig,
    running: Vec<(Arc<Process>, tokio::task::JoinHandle<()>)>,
    started: u32,
    /// Shared by every process of every world on this thread: the
    /// controller only writes its metrics (nothing it decides reads them),
    /// and building a registry is a tenth of a world's time.
    metrics: Arc<Metrics>,
}

thread_local! {
    static METRICS: Arc<Metrics> = Arc::new(Metrics::new());
}

impl Processes {
    fn live(&self) -> Vec<&Arc<Process>> {
        self.running
            .iter()
            .map(|(p, _)| p)
            .filter(|p| !p.is_dead())
            .collect()
    }

    /// Starts one more controller process, from nothing but the world.
    fn start(&mut self) {
        self.started += 1;
        let process = Process::new(format!("p{}", self.started));
        self.world.trace(format_args!("{} starts", process.holder));
        let runtime = Arc::new(SimRuntime::new(self.world.clone(), process.clone()));
        let store = Arc::new(SimStore {
            world: self.world.clone(),
            process: process.clone(),
        });
        let mut config = self.config.clone();
        config.holder = process.holder.clone();
        let controller = Controller::with_engines(
            runtime,
            store,
            TEMPLATED_FAKE_ENGINES,
            config,
            self.clock.clone(),
            self.metrics.clone(),
        );
        let world = self.world.clone();
        let holder = process.holder.clone();
        let task = tokio::spawn(async move {
            // It runs until the world ends: returning is stopping without
            // being asked (a panic ends the task without returning).
            let result = controller.run(std::future::pending()).await;
            world.violate(
                "exit",
                format_args!("{holder}'s controller stopped on its own: {result:?}"),
            );
        });
        self.running.push((process, task));
    }

    /// Ends the task of every process that crashed on its own (after a
    /// call) and starts a new one if none is left.
    fn replace_crashed(&mut self) {
        for (p, task) in &self.running {
            if p.is_dead() && !task.is_finished() {
                task.abort();
            }
        }
        if self.live().is_empty() {
            self.start();
        }
    }

    /// Every live process's controller still runs (a panic that escaped
    /// it ends its task).
    fn check_running(&self) {
        for (p, task) in &self.running {
            if !p.is_dead() && task.is_finished() {
                self.world.violate(
                    "exit",
                    format_args!("{}'s controller task ended (a panic escaped it)", p.holder),
                );
            }
        }
    }

    /// The process `pick` lands on crashes wherever it is; a new one
    /// starts if none is left.
    fn crash(&mut self, pick: u64) {
        let live: Vec<usize> = (0..self.running.len())
            .filter(|i| !self.running[*i].0.is_dead())
            .collect();
        if let Some(&i) = live.get((pick % live.len().max(1) as u64) as usize) {
            let (p, task) = &self.running[i];
            self.world.trace(format_args!("{} crashes", p.holder));
            p.crash();
            task.abort();
        }
        if self.live().is_empty() {
            self.start();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (p, task) in &self.running {
            p.crash();
            task.abort();
        }
    }
}

fn sandbox_id(i: usize) -> SandboxId {
    SandboxId::parse(&format!("sim{i:03}")).expect("a valid id")
}

/// Row `i` as a request writes it at `now` (its last use); every fourth
/// id pauses when idle rather than being released, and every third is
/// [`CAPPED`]'s.
fn row(i: usize, features: u8, now: DateTime<Utc>) -> DesiredSandbox {
    let wanted: BTreeSet<String> = [("alpha", 1u8), ("beta", 2u8)]
        .into_iter()
        .filter(|(_, bit)| features & bit != 0)
        .map(|(f, _)| f.to_owned())
        .collect();
    let mut row = crate::testing::fake_row(
        sandbox_id(i),
        BTreeMap::from([(FakeEngine::NAME, wanted)]),
        epoch(),
    );
    row.last_used_at = now;
    if i % 3 == 1 {
        row.owner = CAPPED.to_owned();
    }
    if i % 4 == 3 {
        row.idle_action = IdleAction::Pause;
        row.idle_timeout = Some(IDLE_TIMEOUT);
    }
    row
}

/// The simulated controllers' deployment.
pub(crate) fn deployment() -> Deployment {
    Deployment::parse("sim").expect("a valid deployment")
}

fn config() -> ControllerConfig {
    let mut config = ControllerConfig::new(deployment());
    config.grace = GRACE;
    config.relist_interval = Duration::from_secs(20);
    config.concurrency = 4;
    config.docker_timeout = Duration::from_secs(5);
    config.store_timeout = Duration::from_secs(2);
    config.reconcile_timeout = Duration::from_secs(30);
    config.shutdown_grace = Duration::from_secs(5);
    config.events_per_sandbox = EVENTS_KEPT;
    // No disks directory: measuring volumes would start a thread, whose
    // timing the world's order would depend on.
    config.disks.dir = "/nonexistent/sandboxd-sim-disks".to_owned();
    // Warm pools: one configured (a sandbox without features), and those
    // learned from what the workload asks for (every feature set).
    // And one of the failing seed: its every start fails, and it must
    // back off.
    config.warm_pool = BTreeMap::from([
        (
            PoolKey {
                engine: FakeEngine::NAME,
                features: BTreeSet::new(),
                seed: None,
            },
            POOL_SIZE,
        ),
        (
            PoolKey {
                engine: FakeEngine::NAME,
                features: BTreeSet::new(),
                seed: Some(seed_hash(FAILING_SEED)),
            },
            1,
        ),
    ]);
    config.warm_pool_demand = PoolDemand {
        max: LEARNED_POOLS,
        window: Duration::from_secs(120),
    };
    config
}

/// Runs the world of `seed` to its end or its first broken invariant.
pub fn run(seed: u64, o: &Options) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    crate::domain::entropy::seeded(seed, || {
        mutation::with(o.mutation, || runtime.block_on(world(seed, o)))
    })
}

async fn world(seed: u64, o: &Options) -> Outcome {
    let config = config();
    let world = World::new(seed, o.switches, GRACE, config.breaker);
    for content in [GOOD_SEED, FAILING_SEED, DATA_FILE_SEED] {
        world.store.put_seed(FakeEngine::NAME.as_str(), content);
    }
    world.store.set_quota(
        CAPPED,
        crate::domain::admission::Quota {
            sandboxes: Some(QUOTA),
            memory_bytes: None,
        },
    );
    let mut procs = Processes {
        world: world.clone(),
        clock: Arc::new(SimClock {
            at: epoch(),
            start: tokio::time::Instant::now(),
        }),
        config,
        running: Vec::new(),
        started: 0,
        metrics: METRICS.with(Arc::clone),
    };
    procs.start();
    let mut snapshot: Vec<DesiredSandbox> = Vec::new();
    let fail =
        |step: usize, world: &World| world.first_violation().map(|what| Failure { step, what });
    for (i, (step, after)) in plan(seed, o).into_iter().enumerate() {
        if o.only.as_ref().is_some_and(|only| !only.contains(&i)) {
            continue;
        }
        world.trace(format_args!("step {i}: {step:?}"));
        act(&world, &mut procs, &mut snapshot, step).await;
        tokio::time::sleep(after).await;
        // A process that crashed after a call is replaced, as a supervisor
        // would.
        procs.replace_crashed();
        procs.check_running();
        world.check_step();
        world.check_growth(EVENTS_KEPT);
        if let Some(failure) = fail(i, &world) {
            return Outcome {
                seed,
                trace: world.take_trace(),
                failure: Some(failure),
            };
        }
    }
    // The faults stop; an operator resumes reaping if the breaker tripped.
    world.trace(format_args!("calm"));
    world.calm_down();
    let now = tokio::time::Instant::now();
    for p in procs.live() {
        p.freeze(now);
        p.crash_after(0);
    }
    if procs.live().is_empty() {
        procs.start();
    }
    let step = o.steps;
    let deadline = tokio::time::Instant::now() + LIVENESS_BOUND;
    let mut why = None;
    while tokio::time::Instant::now() < deadline {
        if world.store.reaping_paused() {
            world.store.resume_reaping();
            world.reaping_resumed();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        procs.check_running();
        world.check_step();
        world.check_growth(EVENTS_KEPT);
        if let Some(failure) = fail(step, &world) {
            return Outcome {
                seed,
                trace: world.take_trace(),
                failure: Some(failure),
            };
        }
        why = world.unconverged();
        if why.is_none() {
            break;
        }
    }
    let failure = why.map(|why| Failure {
        step,
        what: format!(
            "liveness: not converged {}s after the faults stopped: {why}",
            LIVENESS_BOUND.as_secs()
        ),
    });
    if let Some(f) = &failure {
        world.trace(format_args!("VIOLATION {}", f.what));
    }
    Outcome {
        seed,
        trace: world.take_trace(),
        failure,
    }
}

/// The container `pick` lands on, of those the world holds.
fn pick_container(world: &World, pick: u64) -> Option<ContainerId> {
    world.runtime.with_containers(|all| {
        let n = all.len() as u64;
        (n > 0)
            .then(|| all.keys().nth((pick % n) as usize).cloned())
            .flatten()
    })
}

async fn act(
    world: &Arc<World>,
    procs: &mut Processes,
    snapshot: &mut Vec<DesiredSandbox>,
    step: Step,
) {
    let fake = &world.runtime;
    let store = &world.store;
    match step {
        Step::Put {
            sandbox,
            features,
            seed,
        } => {
            let id = sandbox_id(sandbox);
            let existing = store.desired_of(&id);
            // A fork's features are its source's (the database refuses a
            // change): a request of it only touches it.
            if let Some(fork) = existing.as_ref().filter(|r| r.fork_of.is_some()) {
                let mut again = fork.clone();
                again.last_used_at = world.wall();
                store.put_desired(again);
                world.used(&id, Some(fork.last_used_at));
                return;
            }
            // Features only grow on an update (a shrink is a new row); the
            // seed is the new row's.
            let had = existing
                .as_ref()
                .and_then(|r| r.features.get(&FakeEngine::NAME).cloned())
                .unwrap_or_default();
            let bits =
                features | u8::from(had.contains("alpha")) | (u8::from(had.contains("beta")) << 1);
            let mut new = row(sandbox, bits, world.wall());
            new.seeds = match (&existing, seed) {
                (Some(r), _) => r.seeds.clone(),
                (None, 0) => BTreeMap::new(),
                (None, 1) => BTreeMap::from([(FakeEngine::NAME, seed_hash(GOOD_SEED))]),
                (None, 3) => BTreeMap::from([(FakeEngine::NAME, seed_hash(DATA_FILE_SEED))]),
                (None, _) => BTreeMap::from([(FakeEngine::NAME, seed_hash(FAILING_SEED))]),
            };
            store.put_desired(new);
            world.used(&id, existing.map(|r| r.last_used_at));
            world.row_back(&id, store.incarnation_of(&id));
        }
        Step::Touch { sandbox } => {
            let id = sandbox_id(sandbox);
            if let Some(before) = store.touch(&id, world.wall()) {
                world.used(&id, Some(before));
            }
        }
        Step::Fork { sandbox, pick } => {
            let id = sandbox_id(sandbox);
            let rows = store.desired_rows();
            let Some(src) = rows.get((pick % rows.len().max(1) as u64) as usize) else {
                return;
            };
            if store.desired_of(&id).is_some() {
                return;
            }
            let of = src.id.clone();
            let mut fork = row(sandbox, 0, world.wall());
            // `sandbox_fork` forks an owner's own sandboxes only.
            fork.owner.clone_from(&src.owner);
            fork.features = src.features.clone();
            fork.fork_of = Some(ForkOf {
                sandbox: of,
                incarnation: src.incarnation.clone().expect("rows carry an incarnation"),
            });
            store.put_desired(fork);
            world.used(&id, None);
            world.row_back(&id, store.incarnation_of(&id));
        }
        Step::Release { sandbox } => {
            let id = sandbox_id(sandbox);
            if store.desired_of(&id).is_some() {
                world.row_gone(&id);
                store.delete_desired(&id);
            }
        }
        Step::Truncate => {
            let ids: Vec<SandboxId> = store.desired_rows().into_iter().map(|r| r.id).collect();
            world.truncated(&ids);
            for id in &ids {
                world.row_gone(id);
            }
            store.truncate_desired();
        }
        Step::Checkpoint { sandbox } => {
            let id = sandbox_id(sandbox);
            if store.desired_of(&id).is_some() {
                store.request_checkpoint(&id, "cp");
            }
        }
        Step::Reset { sandbox } => {
            let id = sandbox_id(sandbox);
            if store.desired_of(&id).is_some() {
                store.request_reset(&id, "cp");
            }
        }
        Step::Kill { pick, oom } => {
            if let Some(id) = pick_container(world, pick) {
                fake.kill(&id, oom);
            }
        }
        Step::KillFromOutside { pick } => {
            if let Some(id) = pick_container(world, pick) {
                fake.kill_from_outside(&id);
            }
        }
        Step::RemoveFromOutside { pick } => {
            if let Some(id) = pick_container(world, pick) {
                let _ = fake.remove(&id, Duration::ZERO).await;
            }
        }
        Step::PauseFromOutside { pick } => {
            if let Some(id) = pick_container(world, pick) {
                world.tampered(&id);
                let _ = fake.pause(&id).await;
            }
        }
        Step::RenameFromOutside { pick } => {
            if let Some(id) = pick_container(world, pick) {
                world.tampered(&id);
                let _ = fake.rename(&id, &format!("renamed-{id}")).await;
            }
        }
        Step::NetworkGone { pick } => {
            if let Some(id) = pick_container(world, pick) {
                if let Some(c) = fake.container(&id) {
                    for (other, oc) in fake.containers() {
                        if oc.spec.network == c.spec.network || oc.joined.contains(&c.spec.network)
                        {
                            world.tampered(&other);
                        }
                    }
                    let _ = fake
                        .remove_network(&c.spec.network, &c.labels.deployment)
                        .await;
                }
            }
        }
        Step::ImageRebuilt { features } => {
            world.rebuild_image(
                &procs
                    .config
                    .images
                    .image_for(&FakeEngine::TEMPLATED, features),
            );
        }
        Step::TemplateGone { pick } => {
            if let Some(name) = fake.remove_template_from_outside(pick) {
                world.trace(format_args!("template volume {name} removed from outside"));
            }
        }
        Step::CutEvents => fake.cut_events(),
        Step::Crash {
            pick,
            after_calls: 0,
        } => procs.crash(pick),
        Step::Crash { pick, after_calls } => {
            let live = procs.live();
            if let Some(p) = live.get((pick % live.len().max(1) as u64) as usize) {
                p.crash_after(after_calls);
            }
        }
        Step::Rival => {
            if procs.live().len() < 2 {
                procs.start();
            }
        }
        Step::Freeze { pick, seconds } => {
            let live = procs.live();
            if let Some(p) = live.get((pick % live.len().max(1) as u64) as usize) {
                p.freeze(tokio::time::Instant::now() + Duration::from_secs(seconds));
            }
        }
        Step::Jump { seconds } => tokio::time::advance(Duration::from_secs(seconds)).await,
        Step::Snapshot => *snapshot = store.desired_rows(),
        Step::Pass => {}
        Step::Restore { empty } => {
            let rows = if empty { Vec::new() } else { snapshot.clone() };
            let kept: BTreeSet<SandboxId> = rows.iter().map(|r| r.id.clone()).collect();
            let lost: Vec<SandboxId> = store
                .desired_rows()
                .into_iter()
                .map(|r| r.id)
                .filter(|id| !kept.contains(id))
                .collect();
            // An emptied table is a truncate to the breaker; an older copy
            // loses only what was made since (grace still holds for it).
            if empty {
                world.truncated(&lost);
            }
            for id in &lost {
                world.row_gone(id);
            }
            store.restore_desired(rows);
            for id in &kept {
                world.row_back(id, store.incarnation_of(id));
            }
        }
    }
}

/// The one-line command that replays `seed` (with `only` its shrunk
/// steps, and `mutation` the broken controller it ran).
pub fn replay_command(seed: u64, o: &Options) -> String {
    let mut cmd = format!("SANDBOXD_SIM_SEED={seed}");
    if let Some(only) = &o.only {
        let steps: Vec<String> = only.iter().map(usize::to_string).collect();
        cmd += &format!(" SANDBOXD_SIM_STEPS={}", steps.join(","));
    }
    if let Some(m) = o.mutation {
        cmd += &format!(" SANDBOXD_SIM_MUTATION={}", m.name());
    }
    cmd + " cargo test --lib testing::dst::tests::replay -- --nocapture"
}

/// The fewest workload steps of `seed` that still break the same
/// invariant (delta debugging over the plan; at most `budget` reruns).
pub fn shrink(seed: u64, o: &Options, failure: &Failure, budget: usize) -> (Options, Outcome) {
    let invariant = failure.invariant().to_owned();
    let mut kept: Vec<usize> = (0..=failure.step.min(o.steps.saturating_sub(1))).collect();
    if let Some(only) = &o.only {
        kept.retain(|i| only.contains(i));
    }
    let mut best = o.clone();
    best.only = Some(kept.iter().copied().collect());
    let mut outcome = run(seed, &best);
    if outcome.failure.as_ref().map(Failure::invariant) != Some(invariant.as_str()) {
        // Cutting what came after the failure changed the world: keep all.
        best.only = o.only.clone();
        return (best.clone(), run(seed, &best));
    }
    let mut runs = 1;
    let mut chunk = (kept.len() / 2).max(1);
    while runs < budget {
        let mut removed_any = false;
        let mut i = 0;
        while i < kept.len() && runs < budget {
            let trial: Vec<usize> = kept
                .iter()
                .enumerate()
                .filter(|(j, _)| *j < i || *j >= i + chunk)
                .map(|(_, s)| *s)
                .collect();
            let mut candidate = o.clone();
            candidate.only = Some(trial.iter().copied().collect());
            let out = run(seed, &candidate);
            runs += 1;
            if out.failure.as_ref().map(Failure::invariant) == Some(invariant.as_str()) {
                kept = trial;
                best = candidate;
                outcome = out;
                removed_any = true;
            } else {
                i += chunk;
            }
        }
        match (chunk, removed_any) {
            (1, false) => break,
            (1, true) => {}
            _ => chunk /= 2,
        }
    }
    (best, outcome)
}

#[cfg(test)]
mod tests;
