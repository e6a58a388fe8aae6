//! Deliberately broken controllers, for proving that each invariant of the
//! simulation (`crate::testing::dst`) bites: a mutation switched on for one
//! world (this thread) makes the controller skip one of its safety rules.
//! Production code asks [`on`] only in builds with the test fakes (this
//! module exists only there), and [`in_world`] where a simulated Docker
//! behaves unlike a real one.

use std::cell::Cell;

/// One safety rule the controller can be made to skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutation {
    /// The runtime's guard lets every change through, leader or not.
    SkipFence,
    /// A row's deletion is reaped at once, without its grace window.
    IgnoreGrace,
    /// The reaping breaker never trips.
    NoBreaker,
    /// A reconcile trusts the sandbox's previous status over the runtime:
    /// a sandbox published ready is not looked at again.
    TrustStatus,
    /// A container's existing twin is not noticed: a second is created.
    IgnoreTwins,
    /// A status is published with a password the container was not
    /// started with.
    WrongPassword,
    /// A term whose watches fail to start ends the process (the bug the
    /// simulation found, put back).
    QuitOnWatchFailure,
    /// Every event of a sandbox is kept, none pruned.
    KeepEveryEvent,
    /// A running container is not recognised as the one whose credentials
    /// are published: it is replaced (healed onto a new container) at
    /// every reconcile instead of kept.
    ReplaceServing,
    /// A ready warm-pool container a reconcile reserves stays in the
    /// pool's memory: the next reconcile reserves (and claims) it again.
    ServeTwice,
    /// A fork copies the container that serves its source's id now,
    /// whatever its incarnation: a source released and requested again
    /// gives the fork another sandbox's data.
    ForkWrongSource,
    /// A new container's seed is never loaded.
    SkipSeed,
    /// A warm pool whose starts fail never backs off.
    NoPoolBackoff,
    /// A sandbox that pauses when idle is paused whether it is idle or
    /// not.
    PauseBusy,
    /// Admission lets every sandbox in, whatever its owner's quota.
    IgnoreQuota,
    /// A seed that is a data file is sent to the engine as statements
    /// instead of being written into a volume the container starts from.
    IgnoreDataFile,
    /// A new container mounts its image's template whatever features it
    /// was built with.
    TemplateAnyFeatures,
}

impl Mutation {
    /// Every mutation, in a fixed order.
    pub const ALL: [Mutation; 17] = [
        Mutation::SkipFence,
        Mutation::IgnoreGrace,
        Mutation::NoBreaker,
        Mutation::TrustStatus,
        Mutation::IgnoreTwins,
        Mutation::WrongPassword,
        Mutation::QuitOnWatchFailure,
        Mutation::KeepEveryEvent,
        Mutation::ReplaceServing,
        Mutation::ServeTwice,
        Mutation::ForkWrongSource,
        Mutation::SkipSeed,
        Mutation::NoPoolBackoff,
        Mutation::PauseBusy,
        Mutation::IgnoreQuota,
        Mutation::IgnoreDataFile,
        Mutation::TemplateAnyFeatures,
    ];

    /// Its name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            Mutation::SkipFence => "skip-fence",
            Mutation::IgnoreGrace => "ignore-grace",
            Mutation::NoBreaker => "no-breaker",
            Mutation::TrustStatus => "trust-status",
            Mutation::IgnoreTwins => "ignore-twins",
            Mutation::WrongPassword => "wrong-password",
            Mutation::QuitOnWatchFailure => "quit-on-watch-failure",
            Mutation::KeepEveryEvent => "keep-every-event",
            Mutation::ReplaceServing => "replace-serving",
            Mutation::ServeTwice => "serve-twice",
            Mutation::ForkWrongSource => "fork-wrong-source",
            Mutation::SkipSeed => "skip-seed",
            Mutation::NoPoolBackoff => "no-pool-backoff",
            Mutation::PauseBusy => "pause-busy",
            Mutation::IgnoreQuota => "ignore-quota",
            Mutation::IgnoreDataFile => "ignore-data-file",
            Mutation::TemplateAnyFeatures => "template-any-features",
        }
    }

    /// The invariant that must catch it.
    pub fn caught_by(self) -> &'static str {
        match self {
            Mutation::SkipFence => "leader",
            Mutation::IgnoreGrace => "grace",
            Mutation::NoBreaker => "breaker",
            Mutation::TrustStatus => "liveness",
            Mutation::IgnoreTwins => "one-container",
            Mutation::WrongPassword => "credentials",
            Mutation::QuitOnWatchFailure => "exit",
            Mutation::KeepEveryEvent => "growth",
            Mutation::ReplaceServing => "reap",
            Mutation::ServeTwice => "pool",
            Mutation::ForkWrongSource => "fork-data",
            Mutation::SkipSeed => "seed",
            Mutation::NoPoolBackoff => "backoff",
            Mutation::PauseBusy => "idle",
            Mutation::IgnoreQuota => "quota",
            Mutation::IgnoreDataFile => "liveness",
            Mutation::TemplateAnyFeatures => "template",
        }
    }

    /// The mutation named `name`.
    pub fn parse(name: &str) -> Option<Mutation> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

thread_local! {
    static ACTIVE: Cell<Option<Mutation>> = const { Cell::new(None) };
    static IN_WORLD: Cell<bool> = const { Cell::new(false) };
}

/// Whether a simulated world runs on this thread.
pub(crate) fn in_world() -> bool {
    IN_WORLD.get()
}

/// Whether `m` is switched on for the world running on this thread.
pub(crate) fn on(m: Mutation) -> bool {
    ACTIVE.get() == Some(m)
}

/// Runs `f` as a simulated world, with `m` (if any) switched on; off again
/// afterwards.
pub(crate) fn with<T>(m: Option<Mutation>, f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            ACTIVE.set(None);
            IN_WORLD.set(false);
        }
    }
    ACTIVE.set(m);
    IN_WORLD.set(true);
    let _restore = Restore;
    f()
}
