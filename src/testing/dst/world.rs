//! The simulated world: the fake Docker and the fake state database every
//! process shares, the dice, the trace, and the oracle that knows what
//! really happened (who held the lease, which container carries which
//! password, when each row went) and so can judge every change.

use super::rng::SimRng;
use super::Switches;
use crate::domain::container::ContainerState;
use crate::domain::fork::ForkOf;
use crate::domain::labels::ContainerLabels;
use crate::domain::pool::PoolClaim;
use crate::domain::sandbox::{DesiredSandbox, IdleAction, Phase};
use crate::domain::status::StatusUpdate;
use crate::domain::{ContainerId, Incarnation, SandboxId};
use crate::ports::runtime::ContainerSpec;
use crate::testing::runtime::POOL_ORIGIN;
use crate::testing::store::seed_hash;
use crate::testing::{FakeContainer, FakeEngine, FakeRuntime, FakeStore};
use chrono::{DateTime, Utc};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A row that went (when, and the credential tokens published then, each
/// with the host port agents reach it on: a claim that failed leaves a
/// pool container with the credential token of the container started in
/// its stead, and only the one on the published port is what agents use).
type Gone = (Instant, BTreeSet<(String, u16)>);

/// A row back: when, its incarnation, and its earlier departure.
type Back = (Instant, Option<Incarnation>, Gone);

/// How long a row must be back before its next departure counts afresh.
const BRIEFLY: Duration = Duration::from_secs(5);

/// A container as the oracle remembers it from its creation.
#[derive(Debug, Clone)]
struct Made {
    id: ContainerId,
    labels: ContainerLabels,
    /// What its engine was started with (the password is in there); for
    /// a claimed pool container, the password its claim set.
    secrets: String,
    /// A warm-pool container's claim (the credentials are the claim's).
    claimed: bool,
}

/// The claims of the world's pool containers, by container.
type Claims = BTreeMap<ContainerId, PoolClaim>;

/// What container `id` serves: the sandbox, incarnation, engine and
/// credential set its labels name, or for a warm-pool container those of
/// its recorded claim (a container's labels cannot change); an unclaimed
/// pool container serves nobody.
fn serving<'a>(
    id: &ContainerId,
    c: &'a FakeContainer,
    claims: &Claims,
) -> Option<Cow<'a, ContainerLabels>> {
    if !c.pool {
        return Some(Cow::Borrowed(&c.labels));
    }
    let claim = claims.get(id)?;
    let l = &c.labels;
    Some(Cow::Owned(claim.labels(
        &l.deployment,
        l.state_id.clone(),
        l.isolation,
    )))
}

/// What the oracle knows beyond what the fakes hold.
#[derive(Debug, Default)]
struct Oracle {
    /// Every container ever created, by its credential-set token.
    made: BTreeMap<String, Made>,
    /// Containers a controller removed.
    removed: BTreeSet<ContainerId>,
    /// Containers the world itself changed (paused, renamed, cut off):
    /// a controller may replace them.
    tampered: BTreeSet<ContainerId>,
    /// When each row went (deleted, truncated, lost in a restore), and
    /// the containers whose credentials were published then: what grace
    /// and the breaker protect (a reconcile still replacing a container no
    /// one was told of may remove it).
    gone_at: BTreeMap<SandboxId, Gone>,
    /// Rows that came back (inserted again, restored), when, and when they
    /// had gone: one back for less than [`BRIEFLY`] that goes again counts
    /// from its first departure (no controller need have seen it back).
    back: BTreeMap<SandboxId, Back>,
    /// The incarnation of each row that went, by sandbox.
    gone_incarnation: BTreeMap<SandboxId, Option<Incarnation>>,
    /// The rows each truncate (or emptying restore) took that were enough
    /// to trip the breaker, burst by burst, with the fleet's size then.
    truncated: Vec<(BTreeSet<SandboxId>, usize)>,
    /// Since when each (sandbox, engine) has had more than one live
    /// container.
    excess_since: BTreeMap<(SandboxId, String), Instant>,
    /// Every warm-pool claim ever recorded: the claimant's credential set,
    /// by container.
    claimed: BTreeMap<ContainerId, String>,
    /// Pool containers a claim's credentials were set in.
    served: BTreeSet<ContainerId>,
    /// When each process started containers of each pool of the failing
    /// seed (one per feature set) lately (within [`BACKOFF_WINDOW`]).
    failing_starts: BTreeMap<(String, String), Vec<(Instant, String)>>,
    /// The uses (requests, touches) of each row within [`STALE_PAUSE`]:
    /// when, and whether the row was idle just before.
    uses: BTreeMap<SandboxId, Vec<(Instant, bool)>>,
    /// Since when each wanted sandbox has held a live container of its
    /// incarnation (by sandbox and incarnation), as of the last step.
    holding_since: BTreeMap<(SandboxId, Option<String>), Instant>,
    /// Each (sandbox, incarnation) that was given a container: only its
    /// first is admission's (a later one is a retry or a heal of what
    /// was admitted then).
    given: BTreeSet<(SandboxId, Option<String>)>,
    /// The ids each image had before it was rebuilt, and when each
    /// stopped being its id.
    former_ids: BTreeMap<String, Vec<(Instant, String)>>,
}

/// How long after an image is rebuilt a container of it may still start
/// from its former id's template: a start reads the image's id before its
/// create lands (a reconcile's deadline, a process frozen meanwhile), and
/// Docker runs the image the reference names when the create lands.
const STALE_IMAGE: Duration = Duration::from_secs(90);

/// How long a sandbox must have held its containers (and its
/// credentials been published) before it surely counts against its
/// owner's quota: a row back with the containers it
/// left (requested again within its grace, or restored) holds them
/// without being admitted, and a sandbox admitted before it came back may
/// still be creating (its creates retried, backing off) for a while.
const SETTLED: Duration = Duration::from_secs(45);

/// How long after a use a controller may still publish a pause it
/// decided before the use: a reconcile's deadline, and a process frozen
/// meanwhile, with room to spare. (The use wakes it to resume.)
const STALE_PAUSE: Duration = Duration::from_secs(90);

/// The window in which a process tries at most [`BACKOFF_STARTS`]
/// starts of one pool of a seed that always fails: the pool backs off
/// 2, 4, 8, 16, 32 s after the failures, so five start in the first
/// minute. A try is a container name: a try whose start from a template
/// failed on a Docker call falls back to a cold start under the same
/// name.
const BACKOFF_WINDOW: Duration = Duration::from_secs(60);
/// See [`BACKOFF_WINDOW`] (the integration test's bound on real Docker).
const BACKOFF_STARTS: usize = 6;

/// The shared world of one seed.
pub(crate) struct World {
    pub(crate) runtime: Arc<FakeRuntime>,
    pub(crate) store: Arc<FakeStore>,
    pub(crate) rng: Mutex<SimRng>,
    pub(crate) switches: Switches,
    pub(crate) grace: Duration,
    /// Every call goes into the trace, reads too (`SANDBOXD_SIM_DEBUG`).
    pub(crate) debug: bool,
    breaker: crate::domain::breaker::BreakerPolicy,
    calm: AtomicBool,
    start: Instant,
    trace: Mutex<String>,
    violations: Mutex<Vec<String>>,
    oracle: Mutex<Oracle>,
}

impl World {
    pub(crate) fn new(
        seed: u64,
        switches: Switches,
        grace: Duration,
        breaker: crate::domain::breaker::BreakerPolicy,
    ) -> Arc<Self> {
        Arc::new(Self {
            runtime: Arc::new(FakeRuntime::default()),
            store: Arc::new(FakeStore::default()),
            rng: Mutex::new(SimRng::new(seed)),
            switches,
            grace,
            debug: std::env::var_os("SANDBOXD_SIM_DEBUG").is_some(),
            breaker,
            calm: AtomicBool::new(false),
            start: Instant::now(),
            trace: Mutex::new(String::new()),
            violations: Mutex::new(Vec::new()),
            oracle: Mutex::default(),
        })
    }

    /// Faults stop: every call goes through, every event arrives.
    pub(crate) fn calm_down(&self) {
        self.calm.store(true, Ordering::SeqCst);
    }

    pub(crate) fn calm(&self) -> bool {
        self.calm.load(Ordering::SeqCst)
    }

    /// The simulated wall clock (what the controllers' clock says).
    pub(crate) fn wall(&self) -> DateTime<Utc> {
        super::epoch() + chrono::Duration::from_std(self.elapsed()).expect("a short world")
    }

    /// Simulated time since the world began.
    pub(crate) fn elapsed(&self) -> Duration {
        Instant::now() - self.start
    }

    /// Appends one line to the trace, stamped with simulated time.
    pub(crate) fn trace(&self, line: std::fmt::Arguments<'_>) {
        let mut t = self.trace.lock().unwrap();
        let at = self.elapsed();
        let _ = writeln!(t, "{:>5}.{:03} {line}", at.as_secs(), at.subsec_millis());
    }

    pub(crate) fn take_trace(&self) -> String {
        std::mem::take(&mut self.trace.lock().unwrap())
    }

    pub(crate) fn violate(&self, invariant: &str, what: std::fmt::Arguments<'_>) {
        let line = format!("{invariant}: {what}");
        self.trace(format_args!("VIOLATION {line}"));
        self.violations.lock().unwrap().push(line);
    }

    pub(crate) fn first_violation(&self) -> Option<String> {
        self.violations.lock().unwrap().first().cloned()
    }

    // --- what the driver tells the oracle ---

    /// A row went at this moment (its grace counts from now).
    pub(crate) fn row_gone(&self, id: &SandboxId) {
        let incarnation = self.store.desired_of(id).and_then(|r| r.incarnation);
        let published: BTreeSet<(String, u16)> = self
            .store
            .status_of(id)
            .filter(|s| s.phase == Phase::Ready && s.incarnation == incarnation)
            .map(|s| {
                s.services
                    .values()
                    .map(|svc| (svc.instance.clone(), svc.host_port))
                    .collect()
            })
            .unwrap_or_default();
        let mut o = self.oracle.lock().unwrap();
        let now = Instant::now();
        let gone = match o.back.remove(id) {
            // The same row (incarnation) back briefly, gone again.
            Some((back_at, was, (earlier, seen)))
                if now - back_at < BRIEFLY && was == incarnation =>
            {
                (earlier, seen.union(&published).cloned().collect())
            }
            _ => (now, published),
        };
        o.gone_at.entry(id.clone()).or_insert(gone);
        o.gone_incarnation.insert(id.clone(), incarnation);
    }

    /// Row `id` was used now (requested or touched); its last use before
    /// was `before` (`None`: a new row).
    pub(crate) fn used(&self, id: &SandboxId, before: Option<DateTime<Utc>>) {
        let Some(row) = self.store.desired_of(id) else {
            return;
        };
        let now = Instant::now();
        let wall = self.wall();
        let idle_before = before.is_some_and(|b| idle_at(&row, b).is_some_and(|t| t <= wall));
        let mut o = self.oracle.lock().unwrap();
        let uses = o.uses.entry(id.clone()).or_default();
        uses.retain(|(at, _)| now - *at <= STALE_PAUSE);
        uses.push((now, idle_before));
    }

    /// A row is (again) wanted.
    pub(crate) fn row_back(&self, id: &SandboxId, incarnation: Option<Incarnation>) {
        let mut o = self.oracle.lock().unwrap();
        let went = o.gone_incarnation.remove(id).flatten();
        if let Some(gone) = o.gone_at.remove(id) {
            if went.is_some() && went == incarnation {
                o.back
                    .insert(id.clone(), (Instant::now(), incarnation, gone));
            }
        }
        for (burst, _) in &mut o.truncated {
            burst.remove(id);
        }
    }

    /// A truncate (or a restore) took `ids` (their rows are still there):
    /// if they are enough to trip the breaker, none of them may be reaped
    /// while they still are, until an operator resumes. (The rule is judged
    /// both now and at the reap: the controller weighs the fleet at its
    /// relists, and the fleet changes in between.)
    pub(crate) fn truncated(&self, ids: &[SandboxId]) {
        let lost: BTreeSet<SandboxId> = ids.iter().cloned().collect();
        let fleet = self.fleet();
        if self.debug {
            let n = lost.iter().filter(|id| fleet.contains(*id)).count();
            let released = self.store.released();
            self.trace(format_args!(
                "oracle: {n} of {} sandboxes with containers lost their rows; tombstones {released:?}; fleet {fleet:?}",
                fleet.len()
            ));
        }
        if self.breaker_trips(&lost, &fleet, 0, |_| true) {
            self.oracle
                .lock()
                .unwrap()
                .truncated
                .push((lost, fleet.len()));
        }
    }

    /// The sandboxes with containers that were not released (a released
    /// one is on its way out: the breaker weighs a burst against the rest).
    fn fleet(&self) -> BTreeSet<SandboxId> {
        let released: BTreeSet<String> = self.store.released().into_iter().collect();
        let claims = self.store.claims();
        self.runtime
            .with_containers(|all| {
                all.iter()
                    .filter_map(|(id, c)| Some(serving(id, c, &claims)?.sandbox.clone()))
                    .collect::<BTreeSet<_>>()
            })
            .into_iter()
            .filter(|id| self.store.desired_of(id).is_some() || !released.contains(id.as_str()))
            .collect()
    }

    /// `BreakerPolicy`'s rule: the sandboxes of `lost` with containers whose
    /// row is `missing` are at least `min` and more than `share` of `fleet`
    /// (or of `at_least` sandboxes, if that is more).
    fn breaker_trips(
        &self,
        lost: &BTreeSet<SandboxId>,
        fleet: &BTreeSet<SandboxId>,
        at_least: usize,
        missing: impl Fn(&SandboxId) -> bool,
    ) -> bool {
        let n = lost
            .iter()
            .filter(|id| fleet.contains(*id) && missing(id))
            .count();
        self.breaker.trips(n, fleet.len().max(at_least))
    }

    /// Whether the rows a truncate took that are still missing, with
    /// containers, are enough to trip the breaker now: weighed against the
    /// fleet as it is and as it was at the truncate (the larger), since
    /// the controller weighs a burst at its looks, and sandboxes released
    /// after a look that let the burst go must not make it trip in
    /// hindsight (seed 261757).
    fn breaker_must_hold(&self, burst: &BTreeSet<SandboxId>, fleet_then: usize) -> bool {
        let fleet = self.fleet();
        self.breaker_trips(burst, &fleet, fleet_then, |id| {
            self.store.desired_of(id).is_none()
        })
    }

    /// The operator resumed reaping.
    pub(crate) fn reaping_resumed(&self) {
        self.oracle.lock().unwrap().truncated.clear();
    }

    /// The world changed `id` behind the controllers' backs.
    pub(crate) fn tampered(&self, id: &ContainerId) {
        self.oracle.lock().unwrap().tampered.insert(id.clone());
    }

    /// The world built `image` again: it has a new id from now on.
    pub(crate) fn rebuild_image(&self, image: &str) {
        let former = self.runtime.rebuild_image(image);
        self.trace(format_args!("image {image} rebuilt (was {former})"));
        let mut o = self.oracle.lock().unwrap();
        o.former_ids
            .entry(image.to_owned())
            .or_default()
            .push((Instant::now(), former));
    }

    /// A controller's create reached the world.
    pub(crate) fn created(&self, holder: &str, id: &ContainerId, spec: &ContainerSpec) {
        self.check_template(holder, id, spec);
        let Some(labels) = ContainerLabels::parse(&spec.labels) else {
            return;
        };
        self.check_quota(holder, &labels.sandbox, labels.incarnation.clone(), id);
        let secrets = spec
            .stdin
            .as_ref()
            .map(|s| s.expose().to_owned())
            .unwrap_or_default();
        self.oracle.lock().unwrap().made.insert(
            labels.instance.clone(),
            Made {
                id: id.clone(),
                labels,
                secrets,
                claimed: false,
            },
        );
    }

    /// A claim of a warm-pool container was recorded: no container is
    /// claimed by two sandboxes (or twice by one).
    pub(crate) fn claim_recorded(&self, holder: &str, claim: &PoolClaim) {
        let mut o = self.oracle.lock().unwrap();
        let id = &claim.container;
        if let Some(earlier) = o.claimed.get(id).filter(|i| **i != claim.instance) {
            let earlier = earlier.clone();
            drop(o);
            self.violate(
                "pool",
                format_args!(
                    "{holder} recorded a claim of pool container {id} for {} (credential set {}), which was claimed before (credential set {earlier})",
                    claim.sandbox, claim.instance
                ),
            );
            return;
        }
        o.claimed.insert(id.clone(), claim.instance.clone());
        let Some(c) = self.runtime.container(id) else {
            return;
        };
        let l = &c.labels;
        o.made.insert(
            claim.instance.clone(),
            Made {
                id: id.clone(),
                labels: claim.labels(&l.deployment, l.state_id.clone(), l.isolation),
                secrets: String::new(),
                claimed: true,
            },
        );
    }

    /// A claim's credentials are about to be set in pool container `id`:
    /// no pool container is served twice.
    pub(crate) fn serving_claim(&self, holder: &str, id: &ContainerId) {
        if let Some(claim) = self.store.claims().get(id) {
            self.check_quota(holder, &claim.sandbox, claim.incarnation.clone(), id);
        }
        if !self.oracle.lock().unwrap().served.insert(id.clone()) {
            self.violate(
                "pool",
                format_args!(
                    "{holder} set a claimant's credentials in pool container {id}, which was served before"
                ),
            );
        }
    }

    /// A claim's credentials were set in pool container `id`: what it
    /// opens to now is its claim's credentials.
    pub(crate) fn served_claim(&self, id: &ContainerId) {
        let Some(password) = self.runtime.container(id).map(|c| c.password) else {
            return;
        };
        let mut o = self.oracle.lock().unwrap();
        for m in o.made.values_mut().filter(|m| m.claimed && m.id == *id) {
            m.secrets.clone_from(&password);
        }
    }

    // --- the invariants checked as changes reach the world ---

    /// No Docker change by a process that does not hold the lease now.
    pub(crate) fn check_leader(&self, caller: &str, op: &str, target: &str) {
        let leader = self.store.lease_holder_now();
        if leader.as_deref() != Some(caller) {
            self.violate(
                "leader",
                format_args!(
                    "{caller} made a docker change ({op} {target}) while the lease was {}",
                    leader.map_or("held by nobody".to_owned(), |h| format!("{h}'s")),
                ),
            );
        }
    }

    /// Whether container `id` belongs to a row that is there now, in the
    /// incarnation it was made for.
    pub(crate) fn wants(&self, id: &ContainerId) -> bool {
        let claims = self.store.claims();
        self.runtime.container(id).is_some_and(|c| {
            serving(id, &c, &claims).is_some_and(|l| {
                self.store
                    .desired_of(&l.sandbox)
                    .is_some_and(|r| r.incarnation.as_ref().map(|i| i.to_string()) == l.incarnation)
            })
        })
    }

    /// The containers serving `sandbox` (its own and its claimed pool
    /// containers), each with its state and what it serves.
    fn serving_of(
        &self,
        sandbox: &SandboxId,
    ) -> Vec<(ContainerId, ContainerState, ContainerLabels)> {
        let claims = self.store.claims();
        self.runtime.with_containers(|all| {
            all.iter()
                .filter_map(|(id, c)| {
                    let l = serving(id, c, &claims)?;
                    (l.sandbox == *sandbox).then(|| (id.clone(), c.state, l.into_owned()))
                })
                .collect()
        })
    }

    /// A removal reaps nothing wanted, and nothing before its grace or
    /// past the breaker. `sent_while_wanted`: the row was there when the
    /// controller sent the removal (before the call's time in transit).
    pub(crate) fn check_remove(&self, holder: &str, id: &ContainerId, sent_while_wanted: bool) {
        let Some(fake) = self.runtime.container(id) else {
            return;
        };
        let Some(labels) = serving(id, &fake, &self.store.claims()).map(Cow::into_owned) else {
            // An unclaimed pool container serves nobody.
            self.oracle.lock().unwrap().removed.insert(id.clone());
            return;
        };
        let c = FakeContainer { labels, ..fake };
        let sandbox = &c.labels.sandbox;
        let row = self.store.desired_of(sandbox);
        let mut o = self.oracle.lock().unwrap();
        o.removed.insert(id.clone());
        let running = c.state == ContainerState::Running && !c.paused;
        let wanted = row
            .as_ref()
            .is_some_and(|r| r.incarnation.as_ref().map(|i| i.to_string()) == c.labels.incarnation);
        if wanted && !sent_while_wanted {
            // The row came back (a restore put back the incarnation this
            // container serves) while the removal was in transit: decided
            // on a row that did not want it, re-read just before sending,
            // as with a row that went in transit (below).
            drop(o);
            self.trace(format_args!(
                "{} removal of {id} of {sandbox}, sent while its row wanted another incarnation or none, landed after the row came back",
                holder
            ));
            return;
        }
        if wanted {
            let row = row.expect("wanted");
            // It serves the row unless the row wants features it lacks.
            let current = row
                .features
                .iter()
                .find(|(e, _)| **e == *c.labels.engine.as_str())
                .is_none_or(|(_, f)| f.is_subset(&c.labels.features));
            let twins = self
                .serving_of(sandbox)
                .into_iter()
                .filter(|(other, state, ol)| {
                    other != id && ol.engine == c.labels.engine && *state == ContainerState::Running
                })
                .count();
            // What agents are connected to: its credentials are the
            // published ones.
            let published = self.store.status_of(sandbox).is_some_and(|s| {
                s.incarnation == row.incarnation
                    && s.services
                        .get(c.labels.engine.as_str())
                        .is_some_and(|svc| svc.instance == c.labels.instance)
            });
            if running && current && published && twins == 0 && !o.tampered.contains(id) {
                self.violate(
                    "reap",
                    format_args!(
                        "{} removed {id}, the only live {} container of the wanted sandbox {sandbox}, whose credentials are published",
                        holder, c.labels.engine
                    ),
                );
            }
            return;
        }
        if sent_while_wanted {
            // The row went while the removal was in transit: a replace
            // (or a twin's removal) of a wanted row that the delete
            // overtook, not a reap. Docker takes no precondition on a row
            // in Postgres; reading the row just before sending is all a
            // controller can do, and what it does before a replace.
            drop(o);
            self.trace(format_args!(
                "{} removal of {id} of {sandbox}, sent while its row was there, landed after the row went",
                holder
            ));
            return;
        }
        let Some((at, published)) = o.gone_at.get(sandbox) else {
            return;
        };
        // A rotation the row asked for before it went may still finish:
        // destroying the old container after building the new one is its
        // last step, not a reap.
        let rotated = self
            .serving_of(sandbox)
            .into_iter()
            .any(|(other, state, ol)| {
                other != *id
                    && ol.engine == c.labels.engine
                    && ol.generation > c.labels.generation
                    && state == ContainerState::Running
            });
        if !running || rotated || !published.contains(&(c.labels.instance.clone(), c.host_port)) {
            return;
        }
        let held = o
            .truncated
            .iter()
            .any(|(burst, then)| burst.contains(sandbox) && self.breaker_must_hold(burst, *then));
        if held {
            self.violate(
                "breaker",
                format_args!(
                    "{} reaped {id} of {sandbox}, one of the rows a truncate took, before reaping was resumed",
                    holder
                ),
            );
        }
        let since = Instant::now() - *at;
        if since < self.grace {
            self.violate(
                "grace",
                format_args!(
                    "{} reaped {id} of {sandbox} {:.1}s after its row went (grace {}s)",
                    holder,
                    since.as_secs_f64(),
                    self.grace.as_secs()
                ),
            );
        }
    }

    /// A published status: its credentials log into a container of that
    /// sandbox's current incarnation that no controller removed.
    pub(crate) fn published(&self, holder: &str, id: &SandboxId, update: &StatusUpdate) {
        self.trace(format_args!(
            "{holder} status {id} {:?} gen {}",
            update.phase, update.observed_generation
        ));
        if update.phase == Phase::Paused {
            self.check_idle(holder, id, update);
        }
        if update.phase != Phase::Ready {
            return;
        }
        let Some(row) = self.store.desired_of(id) else {
            return;
        };
        if row.incarnation != update.incarnation {
            return;
        }
        let o = self.oracle.lock().unwrap();
        for (engine, service) in &update.services {
            let made = o.made.get(&service.instance);
            let fine = made.is_some_and(|m| {
                &m.labels.sandbox == id
                    && m.labels.engine == *engine
                    && m.labels.incarnation == row.incarnation.as_ref().map(|i| i.to_string())
                    && m.secrets.contains(service.password.expose())
                    && !o.removed.contains(&m.id)
            });
            let claimed = made.filter(|m| m.claimed && !o.removed.contains(&m.id));
            if let Some(m) = claimed.filter(|m| !m.secrets.contains(service.password.expose())) {
                self.violate(
                    "pool",
                    format_args!(
                        "{holder} published {engine} credentials for {id} that are not its claim's: pool container {} opens to another password",
                        m.id
                    ),
                );
            } else if !fine {
                self.violate(
                    "credentials",
                    format_args!(
                        "{holder} published {engine} credentials for {id} that log into no live container of its incarnation ({})",
                        match made {
                            None => "no such container was made".to_owned(),
                            Some(m) if o.removed.contains(&m.id) => format!("{} was removed", m.id),
                            Some(m) if !m.secrets.contains(service.password.expose()) =>
                                format!("{} was started with another password", m.id),
                            Some(m) => format!("{} belongs to {} of another incarnation", m.id, m.labels.sandbox),
                        }
                    ),
                );
            }
        }
        if let Some(of) = &row.fork_of {
            self.check_fork_data(&o, holder, id, of, update);
        }
        self.check_seeded(&o, holder, &row, update);
    }

    /// A container started from a template (and its binaries) starts from
    /// what was built for its engine, its features and the image it runs:
    /// the template volume's labels say what its job built, and the world
    /// knows the image's id (one rebuilt within [`STALE_IMAGE`] may still
    /// be met under its former id).
    fn check_template(&self, holder: &str, id: &ContainerId, spec: &ContainerSpec) {
        use crate::domain::labels::{ENGINE, FEATURES};
        use crate::domain::template_volume::{TEMPLATE, TEMPLATE_BINARIES, TEMPLATE_IMAGE};
        let now_id = self.runtime.image_id_now(&spec.image);
        let image_fits = |built: Option<&String>| {
            built == Some(&now_id)
                || self
                    .oracle
                    .lock()
                    .unwrap()
                    .former_ids
                    .get(&spec.image)
                    .is_some_and(|f| {
                        f.iter().any(|(until, former)| {
                            Some(former) == built && until.elapsed() < STALE_IMAGE
                        })
                    })
        };
        let label = |key: &str| spec.labels.get(key).map_or("", String::as_str);
        let mounts = [
            (&spec.template, TEMPLATE),
            (&spec.binaries, TEMPLATE_BINARIES),
        ];
        for (volume, kind) in mounts {
            let Some(v) = volume else { continue };
            let Some(built) = self.runtime.volume_labels(&v.name) else {
                continue;
            };
            let built_label = |key: &str| built.get(key).map_or("", String::as_str);
            let wrong = if !image_fits(built.get(TEMPLATE_IMAGE)) {
                Some(format!(
                    "image {} (id {now_id}), the template's {}",
                    spec.image,
                    built_label(TEMPLATE_IMAGE)
                ))
            } else if built_label(kind) != label(ENGINE) {
                Some(format!(
                    "engine {}, the template's {}",
                    label(ENGINE),
                    built_label(kind)
                ))
            } else if kind == TEMPLATE && built_label(FEATURES) != label(FEATURES) {
                Some(format!(
                    "features [{}], the template's [{}]",
                    label(FEATURES),
                    built_label(FEATURES)
                ))
            } else {
                None
            };
            if let Some(wrong) = wrong {
                self.violate(
                    "template",
                    format_args!(
                        "{holder} started {id} ({}) from {}, built for another: {wrong}",
                        spec.name, v.name
                    ),
                );
            }
        }
    }

    /// The first container of a sandbox's incarnation, `new`, is given
    /// only while its owner holds fewer sandboxes than its quota allows
    /// (counting those that have held theirs for [`SETTLED`]).
    fn check_quota(
        &self,
        holder: &str,
        sandbox: &SandboxId,
        incarnation: Option<String>,
        new: &ContainerId,
    ) {
        let first =
            (self.oracle.lock().unwrap().given).insert((sandbox.clone(), incarnation.clone()));
        let Some(row) = self.store.desired_of(sandbox) else {
            return;
        };
        if !first || row.incarnation.as_ref().map(ToString::to_string) != incarnation {
            return;
        }
        let Some(limit) = self.store.quota_of(&row.owner).sandboxes else {
            return;
        };
        // Whether `id` holds a live container of its row's incarnation now
        // (other than `new`).
        let holds_now = |id: &SandboxId| {
            let r = self.store.desired_of(id)?;
            let incarnation = r.incarnation.as_ref().map(ToString::to_string);
            let holds = self.serving_of(id).iter().any(|(c, state, l)| {
                c != new && *state == ContainerState::Running && l.incarnation == incarnation
            });
            holds.then_some((r.owner, incarnation))
        };
        if holds_now(sandbox).is_some() {
            return;
        }
        let now = Instant::now();
        let o = self.oracle.lock().unwrap();
        let settled: Vec<&SandboxId> = o
            .holding_since
            .iter()
            .filter(|((id, _), since)| now - **since >= SETTLED && id != sandbox)
            .filter(|((id, incarnation), _)| {
                // Up as its owner sees it: its credentials published too (a
                // container a failed create left, not yet removed, is not
                // a sandbox the owner has, and a list may not show it).
                let published = self.store.status_of(id).is_some_and(|s| {
                    s.incarnation.as_ref().map(ToString::to_string) == *incarnation
                        && !s.services.is_empty()
                });
                published
                    && holds_now(id)
                        .is_some_and(|(owner, now_of)| owner == row.owner && now_of == *incarnation)
            })
            .map(|((id, _), _)| id)
            .collect();
        if settled.len() as u64 >= limit {
            self.violate(
                "quota",
                format_args!(
                    "{holder} gave {sandbox}, a new sandbox of owner '{}', container {new} while {settled:?} held the {limit} its quota allows",
                    row.owner
                ),
            );
        }
    }

    /// A sandbox published paused was idle: past its idle timeout now, or
    /// idle until a use so recent that the pause may have been decided
    /// before it.
    fn check_idle(&self, holder: &str, id: &SandboxId, update: &StatusUpdate) {
        let Some(row) = self.store.desired_of(id) else {
            return;
        };
        if row.incarnation != update.incarnation {
            return;
        }
        let wall = self.wall();
        let Some(idle) = idle_at(&row, row.last_used_at) else {
            self.violate(
                "idle",
                format_args!("{holder} published {id} paused, but its row never pauses"),
            );
            return;
        };
        if idle <= wall {
            return;
        }
        let now = Instant::now();
        let o = self.oracle.lock().unwrap();
        let raced = o.uses.get(id).is_some_and(|uses| {
            uses.iter()
                .any(|(at, idle_before)| *idle_before && now - *at <= STALE_PAUSE)
        });
        if !raced {
            self.violate(
                "idle",
                format_args!(
                    "{holder} published {id} paused at {wall}, but it was last used at {} and is idle only from {idle}",
                    row.last_used_at
                ),
            );
        }
    }

    /// A ready seeded sandbox's data holds its seed: each seeded engine's
    /// container loaded it (or started from a copy of one that had).
    fn check_seeded(&self, o: &Oracle, holder: &str, row: &DesiredSandbox, update: &StatusUpdate) {
        for (engine, hash) in &row.seeds {
            let Some(service) = update.services.get(engine.as_str()) else {
                continue;
            };
            let Some(m) = o.made.get(&service.instance) else {
                continue;
            };
            let Some(c) = self.runtime.container(&m.id) else {
                continue;
            };
            let want = self
                .store
                .seed_content(hash)
                .map(|b| String::from_utf8_lossy(&b).into_owned());
            if c.seed != want {
                self.violate(
                    "seed",
                    format_args!(
                        "{holder} published {} ready with seed {hash}, but its {engine} container {} holds {:?}",
                        row.id, m.id, c.seed
                    ),
                );
            }
        }
    }

    /// A process's create of a pool container reached the world: one of
    /// the failing seed's pool counts towards its back-off.
    pub(crate) fn pool_started(&self, holder: &str, spec: &ContainerSpec) {
        let pool = spec
            .labels
            .get(crate::domain::pool::POOL)
            .map(String::as_str)
            == Some("1");
        let failing = seed_hash(super::FAILING_SEED);
        if !pool || spec.labels.get(crate::domain::seed::SEED) != Some(&failing.to_string()) {
            return;
        }
        let now = Instant::now();
        let mut o = self.oracle.lock().unwrap();
        let features = spec.labels.get(crate::domain::labels::FEATURES);
        let key = (holder.to_owned(), features.cloned().unwrap_or_default());
        let starts = o.failing_starts.entry(key).or_default();
        starts.retain(|(t, _)| now - *t < BACKOFF_WINDOW);
        starts.push((now, spec.name.clone()));
        let n = (starts.iter().map(|(_, name)| name))
            .collect::<BTreeSet<_>>()
            .len();
        drop(o);
        if n > BACKOFF_STARTS {
            self.violate(
                "backoff",
                format_args!(
                    "{holder} tried {n} starts of a pool of the failing seed (features {:?}) within {}s",
                    features,
                    BACKOFF_WINDOW.as_secs()
                ),
            );
        }
    }

    /// A ready fork's data is a copy of its source's named incarnation:
    /// each engine's container started from a copy whose data that
    /// incarnation of the source wrote.
    fn check_fork_data(
        &self,
        o: &Oracle,
        holder: &str,
        id: &SandboxId,
        of: &ForkOf,
        update: &StatusUpdate,
    ) {
        let want = format!("{}@{}", of.sandbox, of.incarnation);
        for (engine, service) in &update.services {
            let Some(m) = o.made.get(&service.instance) else {
                continue;
            };
            let Some(c) = self.runtime.container(&m.id) else {
                continue;
            };
            let from = c.started_from.as_deref().map(|origin| writer(o, origin));
            if from.as_deref() != Some(want.as_str()) {
                self.violate(
                    "fork-data",
                    format_args!(
                        "{holder} published {id} ready, a fork of {want}, whose {engine} container {} started from {}",
                        m.id,
                        from.map_or("no copy".to_owned(), |f| format!("data {f} wrote")),
                    ),
                );
            }
        }
    }

    // --- the invariants checked after every step ---

    /// Checks what must hold at every moment.
    pub(crate) fn check_step(&self) {
        let mut live: BTreeMap<(SandboxId, String), u32> = BTreeMap::new();
        let mut holding: BTreeSet<(SandboxId, Option<String>)> = BTreeSet::new();
        {
            let o = self.oracle.lock().unwrap();
            // Only a wanted sandbox's: an unwanted one's wait for its reap
            // (and for the breaker), which other invariants judge.
            let wanted: BTreeMap<SandboxId, Option<String>> = self.store.with_rows(|rows, _| {
                rows.values()
                    .map(|r| {
                        (
                            r.id.clone(),
                            r.incarnation.as_ref().map(ToString::to_string),
                        )
                    })
                    .collect()
            });
            let claims = self.store.claims();
            self.runtime.with_containers(|all| {
                for (id, c) in all {
                    let Some(l) = serving(id, c, &claims) else {
                        continue;
                    };
                    let current = wanted.get(&l.sandbox) == Some(&l.incarnation);
                    if current && c.state == ContainerState::Running {
                        holding.insert((l.sandbox.clone(), l.incarnation.clone()));
                    }
                    if current && c.state == ContainerState::Running && !o.tampered.contains(id) {
                        *live
                            .entry((l.sandbox.clone(), l.engine.clone()))
                            .or_default() += 1;
                    }
                }
            });
        }
        // A second live container is a rotation's new one, or what a create
        // that reported failure left: both must be gone within the bound.
        let now = Instant::now();
        let mut o = self.oracle.lock().unwrap();
        o.holding_since.retain(|key, _| holding.contains(key));
        for key in holding {
            o.holding_since.entry(key).or_insert(now);
        }
        o.excess_since
            .retain(|key, _| live.get(key).is_some_and(|n| *n > 1));
        for (key, n) in &live {
            if *n > 1 {
                let since = *o.excess_since.entry(key.clone()).or_insert(now);
                if now - since > super::EXCESS_BOUND {
                    let (sandbox, engine) = key;
                    self.violate(
                        "one-container",
                        format_args!(
                            "{sandbox} has had {n} live {engine} containers for {}s",
                            (now - since).as_secs()
                        ),
                    );
                }
            }
        }
        drop(o);
        let shared = self.store.with_rows(|_, statuses| {
            let mut owners: BTreeMap<&str, &SandboxId> = BTreeMap::new();
            for status in statuses.values() {
                for service in status.services.values() {
                    let password = service.password.expose();
                    if password.is_empty() {
                        continue;
                    }
                    if let Some(other) = owners.insert(password, &status.id) {
                        if *other != status.id {
                            return Some((other.clone(), status.id.clone()));
                        }
                    }
                }
            }
            None
        });
        if let Some((a, b)) = shared {
            self.violate(
                "credentials",
                format_args!("the same password is published for {a} and {b}"),
            );
        }
    }

    /// Nothing the controller keeps in the store grows without bound: a
    /// sandbox's events of one owner stay within what it is configured to
    /// keep.
    pub(crate) fn check_growth(&self, keep: u32) {
        let most = self.store.most_events_kept();
        if most > keep as usize {
            self.violate(
                "growth",
                format_args!(
                    "a sandbox keeps {most} events of one owner (at most {keep} are kept)"
                ),
            );
        }
    }

    /// What must hold once faults stopped long enough: every wanted row
    /// ready in its generation with exactly one live container per
    /// engine, and nothing else left. `None` when converged, else why not.
    pub(crate) fn unconverged(&self) -> Option<String> {
        let claims = self.store.claims();
        let never = self.never_ready();
        let wall = self.wall();
        let limits: BTreeMap<String, u64> = self
            .store
            .desired_rows()
            .into_iter()
            .filter_map(|r| Some((r.owner.clone(), self.store.quota_of(&r.owner).sandboxes?)))
            .collect();
        self.store.with_rows(|rows, statuses| {
            self.runtime.with_containers(|containers| {
                let world = Converged {
                    claims: &claims,
                    never_ready: &never,
                    wall,
                    limits: &limits,
                };
                unconverged(rows, statuses, containers, &world)
            })
        })
    }

    /// The rows that may never be ready: those of the failing seed, and
    /// forks whose source's named incarnation is gone, waits for its
    /// owner's quota or can never be ready itself, unless they heal from
    /// their copy (see [`World::heals_from_copy`]). sandboxd keeps trying;
    /// the orchestrator must release them.
    fn never_ready(&self) -> BTreeSet<SandboxId> {
        let rows: BTreeMap<SandboxId, DesiredSandbox> = self
            .store
            .desired_rows()
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        rows.values()
            .filter(|r| !self.makeable(&rows, r, 0))
            .map(|r| r.id.clone())
            .collect()
    }

    fn makeable(
        &self,
        rows: &BTreeMap<SandboxId, DesiredSandbox>,
        row: &DesiredSandbox,
        depth: usize,
    ) -> bool {
        let Some(of) = &row.fork_of else {
            // A sandbox of the failing seed is never ready.
            let failing = seed_hash(super::FAILING_SEED);
            return !row.seeds.values().any(|h| *h == failing);
        };
        // Only a heal starts from the copy the fork was made with; a fork
        // whose container went with its row and that is restored copies
        // its source again: it needs the source.
        let waits = |id: &SandboxId| {
            self.store.status_of(id).is_some_and(|s| {
                s.phase == Phase::Pending && s.message.starts_with("waiting for quota")
            })
        };
        let source_makeable = depth < 32
            && rows.get(&of.sandbox).is_some_and(|source| {
                source.incarnation.as_ref() == Some(&of.incarnation)
                    && !waits(&source.id)
                    && self.makeable(rows, source, depth + 1)
            });
        source_makeable || self.heals_from_copy(row)
    }

    /// Whether the fork `row` heals from the copy it was made with,
    /// whatever became of its source: its credentials are published for
    /// its incarnation (a lost container is healed, not created) and that
    /// incarnation's copy is still there.
    fn heals_from_copy(&self, row: &DesiredSandbox) -> bool {
        use crate::domain::labels::{INCARNATION, SANDBOX};
        let incarnation = row.incarnation.as_ref().map(ToString::to_string);
        let published = self
            .store
            .status_of(&row.id)
            .is_some_and(|s| s.incarnation == row.incarnation && !s.services.is_empty());
        let copy =
            crate::domain::fork::volume_name(&super::deployment(), &row.id, FakeEngine::NAME);
        published
            && self.runtime.volume_labels(&copy).is_some_and(|l| {
                l.get(SANDBOX) == Some(&row.id.to_string())
                    && l.get(INCARNATION) == incarnation.as_ref()
            })
    }
}

/// When `row`, last used at `last_used`, is paused for idleness (`None`:
/// it never is; it is released instead).
fn idle_at(row: &DesiredSandbox, last_used: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let timeout = row
        .idle_timeout
        .filter(|_| row.idle_action == IdleAction::Pause)?;
    Some(last_used + chrono::Duration::from_std(timeout).ok()?)
}

/// Who wrote the data `origin` is a copy of (its head): `SANDBOX@INCARNATION`,
/// a pool container's claimant for a pool container's.
fn writer(o: &Oracle, origin: &str) -> String {
    let head = origin.split('<').next().unwrap_or_default();
    let Some(pool) = head.strip_prefix(POOL_ORIGIN) else {
        return head.to_owned();
    };
    o.claimed
        .get(&ContainerId::new(pool))
        .and_then(|instance| o.made.get(instance))
        .map_or_else(
            || format!("unclaimed pool container {pool}"),
            |m| {
                format!(
                    "{}@{}",
                    m.labels.sandbox,
                    m.labels.incarnation.as_deref().unwrap_or("?")
                )
            },
        )
}

/// What [`unconverged`] judges by beyond the tables.
struct Converged<'a> {
    claims: &'a Claims,
    /// The rows that may never be ready ([`World::never_ready`]).
    never_ready: &'a BTreeSet<SandboxId>,
    /// The simulated wall clock now.
    wall: DateTime<Utc>,
    /// The sandboxes each limited owner may hold.
    limits: &'a BTreeMap<String, u64>,
}

/// See [`World::unconverged`].
fn unconverged(
    rows: &BTreeMap<SandboxId, crate::domain::sandbox::DesiredSandbox>,
    statuses: &BTreeMap<SandboxId, crate::domain::sandbox::SandboxStatus>,
    containers: &BTreeMap<ContainerId, FakeContainer>,
    w: &Converged<'_>,
) -> Option<String> {
    let (claims, never_ready, wall) = (w.claims, w.never_ready, w.wall);
    // What each owner holds: its rows up (ready or paused) and those that
    // may never be (admitted, and retried for ever).
    let mut held: BTreeMap<&str, u64> = BTreeMap::new();
    for row in rows.values() {
        let up = statuses.get(&row.id).is_some_and(|s| {
            matches!(s.phase, Phase::Ready | Phase::Paused) && s.incarnation == row.incarnation
        });
        if up || never_ready.contains(&row.id) {
            *held.entry(row.owner.as_str()).or_default() += 1;
        }
    }
    let serving: Vec<(&ContainerId, &FakeContainer, Cow<'_, ContainerLabels>)> = containers
        .iter()
        .filter_map(|(id, c)| Some((id, c, serving(id, c, claims)?)))
        .collect();
    for row in rows.values().filter(|r| !never_ready.contains(&r.id)) {
        let Some(status) = statuses.get(&row.id) else {
            return Some(format!("{} has no status", row.id));
        };
        // A row of an owner that holds all its quota allows waits.
        let full = w
            .limits
            .get(&row.owner)
            .is_some_and(|l| held.get(row.owner.as_str()).copied().unwrap_or(0) >= *l);
        if full && status.phase == Phase::Pending && status.message.starts_with("waiting for quota")
        {
            continue;
        }
        // An idle sandbox that pauses is paused, every container frozen.
        let paused = idle_at(row, row.last_used_at).is_some_and(|t| t <= wall);
        let phase = if paused { Phase::Paused } else { Phase::Ready };
        if status.phase != phase
            // A restored older row has a lower generation than what
            // was observed of it: that still answers its request.
            || status.observed_generation < row.generation
            || status.incarnation != row.incarnation
        {
            return Some(format!(
                "{} is {:?} ({}) at generation {} of incarnation {:?} (the row is at {} of {:?})",
                row.id,
                status.phase,
                status.message,
                status.observed_generation,
                status.incarnation.as_ref().map(ToString::to_string),
                row.generation,
                row.incarnation.as_ref().map(ToString::to_string),
            ));
        }
        for engine in &row.services {
            let live: Vec<&FakeContainer> = serving
                .iter()
                .filter(|(_, c, l)| {
                    l.sandbox == row.id
                        && l.engine == engine.as_str()
                        && c.state == ContainerState::Running
                })
                .map(|(_, c, _)| *c)
                .collect();
            if live.len() != 1 {
                return Some(format!(
                    "{} has {} live {engine} containers",
                    row.id,
                    live.len()
                ));
            }
            if live[0].paused != paused {
                return Some(format!(
                    "{}'s {engine} container is {} although the sandbox is {}",
                    row.id,
                    if live[0].paused {
                        "frozen"
                    } else {
                        "not frozen"
                    },
                    if paused { "idle" } else { "in use" },
                ));
            }
        }
    }
    for (id, _, l) in &serving {
        let wanted = rows
            .get(&l.sandbox)
            .is_some_and(|r| r.incarnation.as_ref().map(ToString::to_string) == l.incarnation);
        if !wanted {
            return Some(format!(
                "{id} of {} is left although its row is gone",
                l.sandbox
            ));
        }
    }
    None
}
