//! Every seed the simulation failed on: CI replays each one on every run.

/// Seeds whose failure was a bug, now fixed: (seed, the shrunk workload
/// steps (empty: all), what broke and how it was fixed). They were found
/// with the workload of the day noted; the workload has changed since, so
/// they replay as ordinary worlds now and guard against nothing specific
/// until they are found again under the current workload.
pub const REGRESSIONS: &[(u64, &[usize], &str)] = &[
    (
        1,
        &[34, 77, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96],
        "leader: a change admitted before a clock jump reached Docker after it (the guard's select let the call win the tie): the guard reads the clock on every poll (2026-12-03, first workload)",
    ),
    (
        44,
        &[],
        "leader: a task woken after a jump was polled for its call before its trust timer fired: same fix (2026-12-03, first workload)",
    ),
    (
        54,
        &[],
        "exit: one LISTEN that timed out at the start of a term ended the process: the watches are retried with back-off (2026-12-03, first workload)",
    ),
    (
        334,
        &[],
        "breaker: a reap was approved by a look whose lists were read before the truncate: a look counts from when its lists were read (2026-12-03, first workload)",
    ),
];

/// Seeds of the current workload that still fail, each with the
/// invariant it breaks and what is known: open bugs (or oracle
/// mistakes) not yet fixed. The CI test fails if any other seed fails,
/// or if one of these stops failing (then it moves to [`REGRESSIONS`]).
pub const OPEN: &[(u64, &str, &str)] = &[
    (
        3527,
        "breaker",
        "released, restored (same incarnation) at 270.4 s, truncated again: the restored row was replaced (its terminating status had dropped the credentials, as the database drops a gone row's) and the replace's removal landed after the next truncate",
    ),
    (
        3829,
        "grace",
        "restored (same incarnation) at 104.8 s, truncated again 36 ms later: replaced because the terminating status had dropped its credentials; the removal, decided while the row was back, landed 2.9 s into the next grace window",
    ),
    (
        4337,
        "grace",
        "restored at 115.7 s, truncated again 69 ms later: the same replace-after-restore, its removal landing inside the new grace window",
    ),
    (
        4877,
        "breaker",
        "restored at 141.95 s, truncated again 173 ms later: the same replace-after-restore, past the breaker's hold",
    ),
    (
        8670,
        "breaker",
        "restored at 169.7 s, truncated again 384 ms later: the same replace-after-restore, past the breaker's hold",
    ),
];
