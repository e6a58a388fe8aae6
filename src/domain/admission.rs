//! Admission: whether a sandbox may create containers now, against its
//! owner's quota and the host's memory budget, in arrival order.
//!
//! The leader keeps one [`Ledger`] for the fleet (the controller has one
//! leader, and it rebuilds the ledger from its first relist each term).
//! What a sandbox *holds* is every engine that has a container (of its
//! state database) or published credentials, and, while its row is
//! wanted, every engine admitted and not created yet (its image being
//! fetched, its provision retried); its memory is one engine
//! memory cap per engine held, whatever the container really uses (tmpfs
//! data counts against the same cap). A rotation's second container, built
//! next to the running one for the seconds until it is ready, is not
//! counted again: the engine is held once. Admission is asked only for the
//! engines a sandbox *creates* (no container and no published credentials):
//! a heal, a rotation or a replacement re-creates what is held already, so
//! a sandbox that runs is never evicted or held back by a quota change.
//!
//! * **Per owner**: the sandboxes an owner holds whose row is still wanted,
//!   and the sum of their memory, against its [`Quota`]. A released or
//!   deleted row's containers, while they wait out the grace window, no
//!   longer count against their owner.
//! * **Host budget**: every engine held by any sandbox (released ones
//!   still waiting to be removed included) plus the warm pools' target
//!   size, against the budget (the host's memory minus a reserve).
//! * **Arrival order** (the row's `created_at`, then its id): a row waits
//!   behind an earlier row of its owner that waits (for anything), and
//!   behind any earlier row that waits for the host's budget. A row that
//!   can never fit (it needs more than the limit or the budget) waits
//!   without holding anyone back.
//! * **All or nothing**: the engines a sandbox creates are admitted
//!   together or not at all, so it is never half-provisioned.

use super::id::{Incarnation, SandboxId};
use super::sandbox::Phase;
use super::status::StatusUpdate;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

/// What a new leader's first relist found a sandbox holding: its owner,
/// whether its row is wanted, the incarnation it holds for, its engines.
pub(crate) type Holding = (String, bool, Option<Incarnation>, BTreeSet<String>);

/// An owner's limits (`sandbox_quotas`); `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Sandboxes the owner may hold at once.
    pub sandboxes: Option<u64>,
    /// The sum of the memory caps of the owner's sandboxes, in bytes.
    pub memory_bytes: Option<u64>,
}

/// A byte count, shown in binary units ("512 MiB", "1.5 GiB").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 || (value - value.round()).abs() < 0.05 {
            write!(f, "{} {}", value.round() as u64, UNITS[unit])
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

/// Parses "512MiB", "4GiB", "1.5 GiB", "2G" (binary multiples) or a plain
/// byte count.
pub(crate) fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    let bytes = number * factor as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes.round() as u64)
}

/// Where a row stands in the arrival order: its `created_at`, then its id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Arrival {
    /// When the row was inserted.
    pub(crate) at: DateTime<Utc>,
    pub(crate) id: SandboxId,
}

/// What a sandbox asks to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub(crate) arrival: Arrival,
    /// The row's owner.
    pub owner: String,
    /// The engines it creates (no container and no credentials yet).
    pub engines: BTreeSet<String>,
    /// The row's incarnation: what the sandbox holds counts as its own
    /// only if it was held for this incarnation.
    pub incarnation: Option<Incarnation>,
}

/// Why a row waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// Its owner's quota (or an earlier row of its owner that waits).
    Owner,
    /// The host's memory budget (or an earlier row that waits for it).
    Budget,
    /// It can never fit (it needs more than a limit or the budget): it
    /// waits for the limit to change and holds no one back.
    Never,
    /// Not judged yet this term (seeded by the first relist, in arrival
    /// order): room for what its row asks is kept ahead of later rows
    /// until its reconcile judges it (or the next relist drops it).
    Unjudged,
}

impl WaitReason {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Owner => "owner",
            WaitReason::Budget => "budget",
            WaitReason::Never => "never",
            WaitReason::Unjudged => "unjudged",
        }
    }
}

/// The decision for one [`Ask`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Create the engines now: they are counted from here on.
    Admit,
    /// Create nothing: the row stays as it is, with this message.
    Wait {
        /// Why.
        reason: WaitReason,
        /// For the status row: the limit and the current use.
        message: String,
    },
}

/// What one sandbox holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    owner: String,
    /// Whether its row is still wanted (counted against its owner).
    wanted: bool,
    /// The incarnation of the row it is held for. A row deleted and
    /// inserted again (or restored from an older copy) is a new sandbox
    /// to admission: what the id held before is on its way out.
    incarnation: Option<Incarnation>,
    engines: BTreeSet<String>,
    /// When the ledger last changed it (see [`Ledger::mark`]).
    seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiter {
    owner: String,
    reason: WaitReason,
    /// For a row not judged yet: the memory its row asks for (room kept
    /// for it ahead of later rows).
    needs: u64,
    seq: u64,
}

/// One owner's use, for metrics and the CLI.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Use {
    /// Sandboxes held whose row is wanted.
    pub sandboxes: u64,
    /// The sum of their memory caps, in bytes.
    pub memory_bytes: u64,
    /// Rows waiting for admission.
    pub waiting: u64,
}

/// The fleet's admissions: what each sandbox holds and who waits, in
/// arrival order.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    held: HashMap<SandboxId, Held>,
    waiting: BTreeMap<Arrival, Waiter>,
    arrivals: HashMap<SandboxId, Arrival>,
    seq: u64,
    /// Each owner's use (wanted sandboxes held, waiting rows), kept as
    /// the ledger changes: a full resync settles every sandbox, so no
    /// step may scan the fleet.
    owners: HashMap<String, Use>,
    /// Engines held by every sandbox.
    engines: u64,
    /// Owners whose use changed since [`Ledger::take_changed`].
    changed: BTreeSet<String>,
    /// Memory cap of one engine container, in bytes.
    engine_bytes: u64,
    /// The warm pools' target size, in bytes (always counted).
    pool_bytes: u64,
    /// The host's memory budget (`None`: unlimited).
    budget: Option<u64>,
}

impl Ledger {
    /// An empty ledger: `engine_bytes` per engine held, `pool_bytes` of
    /// warm pools, `budget` for the host.
    pub fn new(engine_bytes: u64, pool_bytes: u64, budget: Option<u64>) -> Self {
        Ledger {
            engine_bytes,
            pool_bytes,
            budget,
            ..Ledger::default()
        }
    }

    /// The host's memory budget.
    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    pub(crate) fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
    }

    /// Memory counted against the host's budget: every engine held plus
    /// the warm pools.
    pub(crate) fn admitted_bytes(&self) -> u64 {
        self.engines * self.engine_bytes + self.pool_bytes
    }

    /// Rows waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// `owner`'s use (none if it holds and waits for nothing).
    pub(crate) fn use_of(&self, owner: &str) -> Use {
        self.owners.get(owner).copied().unwrap_or_default()
    }

    /// Each owner's use (owners that hold or wait only).
    pub fn usage(&self) -> BTreeMap<String, Use> {
        self.owners.iter().map(|(o, u)| (o.clone(), *u)).collect()
    }

    /// The owners whose use changed since the last call, with their use
    /// now (`None`: they hold and wait for nothing any more).
    pub(crate) fn take_changed(&mut self) -> Vec<(String, Option<Use>)> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|o| {
                let u = self.owners.get(&o).copied();
                (o, u)
            })
            .collect()
    }

    /// `owner`'s use, without `except`'s share.
    fn owner_use(&self, owner: &str, except: &SandboxId) -> Use {
        let mut u = self.owners.get(owner).copied().unwrap_or_default();
        if let Some(h) = self
            .held
            .get(except)
            .filter(|h| h.wanted && h.owner == owner)
        {
            u.sandboxes -= 1;
            u.memory_bytes -= h.engines.len() as u64 * self.engine_bytes;
        }
        u
    }

    /// Adds (or takes away) one sandbox's share of its owner's use and
    /// the host's.
    fn count(&mut self, h: &Held, add: bool) {
        let n = h.engines.len() as u64;
        let bytes = n * self.engine_bytes;
        let u = self.owners.entry(h.owner.clone()).or_default();
        if add {
            self.engines += n;
            if h.wanted {
                u.sandboxes += 1;
                u.memory_bytes += bytes;
            }
        } else {
            self.engines -= n;
            if h.wanted {
                u.sandboxes -= 1;
                u.memory_bytes -= bytes;
            }
        }
        self.tidy(&h.owner.clone());
    }

    fn count_waiter(&mut self, owner: &str, add: bool) {
        let u = self.owners.entry(owner.to_owned()).or_default();
        if add {
            u.waiting += 1;
        } else {
            u.waiting -= 1;
        }
        self.tidy(owner);
    }

    /// Marks `owner` changed, and forgets it once it has nothing.
    fn tidy(&mut self, owner: &str) {
        if self.owners.get(owner) == Some(&Use::default()) {
            self.owners.remove(owner);
        }
        self.changed.insert(owner.to_owned());
    }

    fn put_held(&mut self, id: SandboxId, held: Held) {
        self.take_held(&id);
        self.count(&held, true);
        self.held.insert(id, held);
    }

    fn take_held(&mut self, id: &SandboxId) -> Option<Held> {
        let held = self.held.remove(id)?;
        self.count(&held, false);
        Some(held)
    }

    fn put_waiter(&mut self, arrival: Arrival, waiter: Waiter) {
        self.forget_waiter(&arrival.id);
        self.count_waiter(&waiter.owner, true);
        self.arrivals.insert(arrival.id.clone(), arrival.clone());
        self.waiting.insert(arrival, waiter);
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Decides `ask` with its owner's `quota`; an admitted ask is counted
    /// at once (its engines are held) and leaves the waiting rows, a
    /// waiting one takes (or keeps) its place among them.
    pub fn admit(&mut self, ask: &Ask, quota: Quota) -> Decision {
        #[cfg(any(test, feature = "simulation"))]
        let quota = if super::mutation::on(super::mutation::Mutation::IgnoreQuota) {
            Quota::default()
        } else {
            quota
        };
        let id = &ask.arrival.id;
        let mine = self
            .held
            .get(id)
            .filter(|h| h.wanted && same(h.incarnation.as_ref(), ask.incarnation.as_ref()));
        let new_sandbox = mine.is_none();
        let adding: BTreeSet<&String> = ask
            .engines
            .iter()
            .filter(|e| mine.is_none_or(|h| !h.engines.contains(*e)))
            .collect();
        let needs = adding.len() as u64 * self.engine_bytes;
        let (counted, whole) = if new_sandbox {
            ("this sandbox needs", "this sandbox needs")
        } else {
            (
                "its new engines need",
                "with its new engines this sandbox needs",
            )
        };
        let owner = self.owner_use(&ask.owner, id);
        let own = mine.map_or(0, |h| h.engines.len() as u64 * self.engine_bytes);
        let owner_bytes = owner.memory_bytes + own;
        let owner_sandboxes = owner.sandboxes + u64::from(!new_sandbox);
        let who = &ask.owner;
        let of = |limit: Option<u64>| limit.map_or("unlimited".to_owned(), |l| l.to_string());
        let of_bytes =
            |limit: Option<u64>| limit.map_or("unlimited".to_owned(), |l| Bytes(l).to_string());
        let use_line = format!(
            "owner '{who}' has {owner_sandboxes} of {} sandboxes and {} of {} memory",
            of(quota.sandboxes),
            Bytes(owner_bytes),
            of_bytes(quota.memory_bytes)
        );
        let decision = if !new_sandbox && adding.is_empty() {
            // It re-creates only what it holds (a heal, a replace): it
            // takes no room, so nothing, not even an earlier row that
            // waits for that room, holds it back.
            Decision::Admit
        } else if quota.sandboxes == Some(0) && new_sandbox {
            wait(WaitReason::Never, format!("waiting for quota: owner '{who}' may hold no sandbox (limit sandboxes=0); raise it with `sandboxd quota set`"))
        } else if let Some(limit) = quota.memory_bytes.filter(|l| own + needs > *l) {
            wait(WaitReason::Never, format!("waiting for quota: {whole} {} and the owner's whole memory limit is {} (limit memory={}); it can never fit: raise the limit with `sandboxd quota set` or ask for fewer services", Bytes(own + needs), Bytes(limit), Bytes(limit)))
        } else if let Some(budget) = self.budget.filter(|b| needs + self.pool_bytes > *b) {
            wait(WaitReason::Never, format!("waiting for the host's memory budget: {counted} {} and the whole budget is {} ({} of it kept for warm pools); it can never fit: raise --memory-budget or ask for fewer services", Bytes(needs), Bytes(budget), Bytes(self.pool_bytes)))
        } else if let Some(earlier) = self.earlier(&ask.arrival, |w| {
            w.owner == *who && matches!(w.reason, WaitReason::Owner | WaitReason::Budget)
        }) {
            wait(WaitReason::Owner, format!("waiting for quota: behind '{earlier}', an earlier row of owner '{who}' that waits (rows are admitted in arrival order); {use_line}"))
        } else if let Some(limit) = quota
            .sandboxes
            .filter(|l| new_sandbox && owner_sandboxes >= *l)
        {
            wait(WaitReason::Owner, format!("waiting for quota: {use_line} (limit sandboxes={limit}); admitted when one of its sandboxes is released"))
        } else if let Some(limit) = quota.memory_bytes.filter(|l| owner_bytes + needs > *l) {
            wait(WaitReason::Owner, format!("waiting for quota: {use_line} (limit memory={}), {counted} {}; admitted when some of the owner's memory is released", Bytes(limit), Bytes(needs)))
        } else if self
            .unjudged_before(&ask.arrival, Some(who))
            .is_some_and(|(rows, bytes)| {
                quota
                    .sandboxes
                    .is_some_and(|l| new_sandbox && owner_sandboxes + rows >= l)
                    || quota
                        .memory_bytes
                        .is_some_and(|l| owner_bytes + bytes + needs > l)
            })
        {
            wait(WaitReason::Owner, format!("waiting for quota: the room left is kept for earlier rows of owner '{who}' that sandboxd has not looked at since it took the lead (rows are admitted in arrival order); {use_line}"))
        } else if let Some(earlier) = self.earlier(&ask.arrival, |w| w.reason == WaitReason::Budget)
        {
            wait(WaitReason::Budget, format!("waiting for the host's memory budget: behind '{earlier}', an earlier row that waits for it (rows are admitted in arrival order)"))
        } else if let Some(budget) = self.budget.filter(|b| self.admitted_bytes() + needs > *b) {
            wait(WaitReason::Budget, format!("waiting for the host's memory budget: {} of {} in use, {counted} {}; admitted when memory is released", Bytes(self.admitted_bytes()), Bytes(budget), Bytes(needs)))
        } else if let Some(budget) = self.budget.filter(|b| {
            let kept = self
                .unjudged_before(&ask.arrival, None)
                .map_or(0, |(_, bytes)| bytes);
            self.admitted_bytes() + kept + needs > *b
        }) {
            wait(WaitReason::Budget, format!("waiting for the host's memory budget: {} of {} in use, and the rest is kept for earlier rows that sandboxd has not looked at since it took the lead (rows are admitted in arrival order); {counted} {}", Bytes(self.admitted_bytes()), Bytes(budget), Bytes(needs)))
        } else {
            Decision::Admit
        };
        let seq = self.next_seq();
        match &decision {
            Decision::Admit => {
                self.forget_waiter(id);
                let mut engines = self.take_held(id).map(|h| h.engines).unwrap_or_default();
                engines.extend(ask.engines.iter().cloned());
                self.put_held(
                    id.clone(),
                    Held {
                        owner: ask.owner.clone(),
                        wanted: true,
                        incarnation: ask.incarnation.clone(),
                        engines,
                        seq,
                    },
                );
            }
            Decision::Wait { reason, .. } => {
                self.put_waiter(
                    ask.arrival.clone(),
                    Waiter {
                        owner: ask.owner.clone(),
                        reason: *reason,
                        needs: 0,
                        seq,
                    },
                );
            }
        }
        decision
    }

    /// The rows before `arrival` not judged yet this term (of `owner`, or
    /// of anyone): how many, and the memory their rows ask for.
    fn unjudged_before(&self, arrival: &Arrival, owner: Option<&str>) -> Option<(u64, u64)> {
        let (rows, bytes) = self
            .waiting
            .range(..arrival)
            .filter(|(_, w)| w.reason == WaitReason::Unjudged)
            .filter(|(_, w)| owner.is_none_or(|o| w.owner == o))
            .fold((0, 0), |(n, b), (_, w)| (n + 1, b + w.needs));
        (rows > 0).then_some((rows, bytes))
    }

    /// The first row before `arrival` that waits and matches.
    fn earlier(&self, arrival: &Arrival, matches: impl Fn(&Waiter) -> bool) -> Option<&SandboxId> {
        self.waiting
            .range(..arrival)
            .find(|(_, w)| matches(w))
            .map(|(a, _)| &a.id)
    }

    /// Takes `id` off the waiting rows (its row no longer waits: it is
    /// gone, unwanted, or creates nothing); true if it waited.
    pub(crate) fn forget_waiter(&mut self, id: &SandboxId) -> bool {
        let Some(arrival) = self.arrivals.remove(id) else {
            return false;
        };
        match self.waiting.remove(&arrival) {
            Some(w) => {
                self.count_waiter(&w.owner, false);
                true
            }
            None => false,
        }
    }

    /// Records what `id` holds after a reconcile: `engines` (containers
    /// left and credentials published), counted against `owner` while
    /// `wanted` (for the row's `incarnation`); nothing held drops it.
    /// True if its owner's use or the host's went down (waiting rows may
    /// fit now).
    pub fn settle(
        &mut self,
        id: &SandboxId,
        owner: &str,
        wanted: bool,
        incarnation: Option<&Incarnation>,
        engines: BTreeSet<String>,
    ) -> bool {
        let seq = self.next_seq();
        let before = self.held.get(id).cloned();
        let freed = before.as_ref().is_some_and(|b| {
            b.engines.iter().any(|e| !engines.contains(e)) || (b.wanted && !wanted)
        });
        if engines.is_empty() {
            self.take_held(id);
        } else if before.as_ref().is_some_and(|b| {
            b.owner == owner
                && b.wanted == wanted
                && b.incarnation.as_ref() == incarnation
                && b.engines == engines
        }) {
            // Unchanged (a converged sandbox's reconcile): only touched.
            if let Some(h) = self.held.get_mut(id) {
                h.seq = seq;
            }
        } else {
            self.put_held(
                id.clone(),
                Held {
                    owner: owner.to_owned(),
                    wanted,
                    incarnation: incarnation.cloned(),
                    engines,
                    seq,
                },
            );
        }
        freed
    }

    /// The waiting rows that may be admitted next: each owner's first,
    /// and the first that waits for the host's budget.
    pub(crate) fn heads(&self) -> Vec<SandboxId> {
        let mut owners = HashSet::new();
        let mut heads = Vec::new();
        let mut budget = false;
        for (arrival, w) in self
            .waiting
            .iter()
            .filter(|(_, w)| w.reason != WaitReason::Never)
        {
            let first_of_owner = owners.insert(w.owner.as_str());
            let first_for_budget = !budget && w.reason == WaitReason::Budget;
            budget |= w.reason == WaitReason::Budget;
            if first_of_owner || first_for_budget {
                heads.push(arrival.id.clone());
            }
        }
        heads
    }

    /// Marks the start of a relist's lists: what changes after it is not
    /// pruned by that relist ([`Ledger::prune`]).
    pub fn mark(&mut self) -> u64 {
        self.next_seq()
    }

    /// Drops what a relist that began at `mark` found no trace of (no
    /// row, container or status), unless it changed since, and the rows
    /// still not judged since an earlier relist (a row whose reconcile
    /// keeps failing keeps room for itself one relist interval at most).
    pub fn prune(&mut self, mark: u64, seen: impl Fn(&SandboxId) -> bool) {
        let gone: Vec<SandboxId> = self
            .held
            .iter()
            .filter(|(id, h)| h.seq <= mark && !seen(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.take_held(&id);
        }
        let stale: Vec<SandboxId> = self
            .waiting
            .iter()
            .filter(|(a, w)| w.seq <= mark && (!seen(&a.id) || w.reason == WaitReason::Unjudged))
            .map(|(a, _)| a.id.clone())
            .collect();
        for id in stale {
            self.forget_waiter(&id);
        }
    }

    /// Replaces everything with what a term's first relist found: what
    /// each sandbox holds (owner, wanted, for which incarnation, engines),
    /// and the rows that hold
    /// nothing yet and will be reconciled (owner, how many engines they
    /// ask for), waiting unjudged in arrival order: room is kept for them
    /// ahead of later rows, so a later row is not admitted first because
    /// its reconcile happened to run first.
    pub(crate) fn rebuild(
        &mut self,
        held: impl IntoIterator<Item = (SandboxId, Holding)>,
        unjudged: impl IntoIterator<Item = (Arrival, String, usize)>,
    ) {
        let seq = self.next_seq();
        self.changed.extend(self.owners.keys().cloned());
        self.held.clear();
        self.waiting.clear();
        self.arrivals.clear();
        self.owners.clear();
        self.engines = 0;
        for (id, (owner, wanted, incarnation, engines)) in held {
            if !engines.is_empty() {
                self.put_held(
                    id,
                    Held {
                        owner,
                        wanted,
                        incarnation,
                        engines,
                        seq,
                    },
                );
            }
        }
        for (arrival, owner, engines) in unjudged {
            if self.held.get(&arrival.id).is_some_and(|h| h.wanted) {
                continue;
            }
            let needs = engines as u64 * self.engine_bytes;
            self.put_waiter(
                arrival,
                Waiter {
                    owner,
                    reason: WaitReason::Unjudged,
                    needs,
                    seq,
                },
            );
        }
    }
}

/// Whether what was held for `held` counts for `asking`
/// ([`Incarnation::may_match`]).
fn same(held: Option<&Incarnation>, asking: Option<&Incarnation>) -> bool {
    Incarnation::may_match(
        held.map(Incarnation::as_str),
        asking.map(Incarnation::as_str),
    )
}

/// The status of a row whose new engines wait for admission (nothing of
/// them was created), from the one the status decision made without them:
/// a row that holds nothing yet stays `pending` with `message`; a sandbox
/// that runs stays `ready` with what it has, and says what waits. The
/// row's new generation is not observed until it is admitted.
pub(crate) fn waiting_status(update: &mut StatusUpdate, observed_generation: i64, message: &str) {
    match update.phase {
        Phase::Ready if update.services.is_empty() => {
            update.phase = Phase::Pending;
            update.message = message.to_owned();
        }
        Phase::Ready => {
            update.message = format!("ready; its new engines are not created: {message}");
        }
        _ => {
            update.message = [update.message.as_str(), message]
                .into_iter()
                .filter(|m| !m.is_empty())
                .collect::<Vec<_>>()
                .join("\n");
        }
    }
    update.observed_generation = update.observed_generation.min(observed_generation);
}

fn wait(reason: WaitReason, message: String) -> Decision {
    Decision::Wait { reason, message }
}

#[cfg(test)]
mod tests;
