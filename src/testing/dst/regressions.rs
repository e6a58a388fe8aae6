//! Every seed the simulation failed on: CI replays each one on every run.

/// Seeds whose failure was a bug, now fixed: (seed, the shrunk workload
/// steps (empty: all), what broke and how it was fixed). Each bug has a
/// seed of the current workload, found again by undoing its fix and
/// sweeping (the seed fails with the fix undone and passes with it); the
/// seeds marked "first workload" found the bug first, under a workload
/// that has changed since, and now replay as ordinary worlds.
pub const REGRESSIONS: &[(u64, &[usize], &str)] = &[
    (
        338,
        &[0, 1, 2],
        "leader: a sandbox is put, its container killed, and the clock jumps 32 s; the heal's removal, admitted before the jump, reached Docker after the lease was gone: the guard reads the clock on every poll (2026-12-03, current workload)",
    ),
    (
        332,
        &[0, 2, 3, 4, 6, 7, 8, 9, 12, 13, 15, 17, 24, 25],
        "leader: the same, in another world: same fix (2026-12-03, current workload)",
    ),
    (
        20,
        &[0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13],
        "exit: a LISTEN that timed out at the start of a term ended the process: the start of a term is retried with back-off (2026-12-03, current workload)",
    ),
    (
        12,
        &[4, 5, 6, 7, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 83, 84, 85],
        "exit: the same, with watch_desired failing: same fix (2026-12-03, current workload)",
    ),
    (
        29264,
        &[],
        "breaker: a reap approved by a look whose lists were read before the truncate (shrinks to 65 steps): a look counts from when its lists were read (2026-12-03, current workload; 20 000 seeds from 10 000 found it, none of the first 10 000)",
    ),
    (
        14168,
        &[],
        "reap: a reconcile read a re-inserted row (a new incarnation), hung for 4 s, and meanwhile a restore put back the row of the running container's incarnation; the container was torn down as superseded on the old read, the only live one of a wanted sandbox with published credentials: a teardown the row justified reads the row again first (src/controller/recheck.rs; shrinks to 181 steps; 2026-12-03, found by a sweep from 10 000)",
    ),
    (
        14207,
        &[],
        "breaker: a teardown planned on a read from before a truncate landed while the breaker held the row: same fix (shrinks to 73 steps; 2026-12-03, found by a sweep from 10 000)",
    ),
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
    (
        3829,
        &[24, 25, 27, 30, 32, 34, 50, 51, 52, 54, 55],
        "grace: a row restored with its incarnation while its status (terminating) had dropped the credentials was replaced, and the replace's removal, planned on a read from before the next truncate, landed 1.9 s into the new grace window: a replace reads the row again just before it removes the running container (2026-12-03, current workload)",
    ),
    (
        4877,
        &[41, 42, 44, 46, 52, 60, 61, 62, 64, 67, 69, 70, 104, 106, 107, 110, 112, 113, 120, 126, 130, 131],
        "breaker: the same replace-after-restore, its removal landing while the breaker held the truncated rows: same fix (2026-12-03, current workload)",
    ),
    (
        3527,
        &[],
        "breaker: the same replace-after-restore (shrinks to 125 steps): same fix (2026-12-03, current workload)",
    ),
    (
        4337,
        &[],
        "grace: the same replace-after-restore (shrinks to 50 steps): same fix (2026-12-03, current workload)",
    ),
    (
        8670,
        &[],
        "breaker: the same replace-after-restore (shrinks to 110 steps): same fix (2026-12-03, current workload)",
    ),
    (
        19963,
        &[12, 13, 14, 15, 16, 17, 18, 19, 22, 23, 50, 52, 53, 79, 80, 81, 82, 83, 84, 85, 86, 88, 89, 90, 94, 95, 98, 99, 100, 102, 105, 106, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 136, 138, 140, 141, 142, 143, 145, 146, 147, 148, 151, 152, 153, 158, 159, 160, 161, 162, 163, 164, 165, 166, 167, 168, 169, 172, 173, 174, 175, 176, 184, 186, 196, 197, 198],
        "breaker: the relist a truncate woke (12 of 14 sandboxes with containers) failed before its look, and the next look came an interval (20 s) later, when rows were back, new sandboxes made and released ones reaped, so that the burst no longer showed: a failed relist is tried again after a second, doubling up to the interval (found past the CI range, 2026-12-03; fixed 2026-12-04)",
    ),
    (
        30181,
        &[],
        "breaker: the same lost look (14 of 20; the woken relist's look failed on the store; shrinks to 184 steps): same fix (2026-12-04)",
    ),
    (
        59671,
        &[],
        "breaker: a truncate took 12 of 13 sandboxes with containers, and the two looks after it read full lists answered from views older than most of the fleet (4 sandboxes, fewer than the breaker's minimum): the breaker also counts the sandboxes a reconcile found without a row and with containers (controller::gone). Found in the first 100 000 seeds of a 1 000 000 run (shrinks to 81 steps; 2026-12-04)",
    ),
    (
        91996,
        &[],
        "breaker: the same stale looks (9 of 9 lost; both looks saw one sandbox; shrinks to 56 steps): same fix (2026-12-04)",
    ),
    (
        326400,
        &[],
        "breaker: a truncate took 6 of 6; its notification never came, and the next look read a full list answered from the view before the newest sandbox was made, with no reconcile yet to have seen the rows missing (4 of 4, under the minimum): a look also counts the sandboxes whose status serves engines (ready, healing, paused). Found in seeds 300 000 to 400 000 of a 1 000 000 run (2026-12-04)",
    ),
    (
        214553,
        &[],
        "breaker: the same stale look (11 of 11 lost; the look saw 2): same fix (2026-12-04)",
    ),
    (
        220893,
        &[],
        "grace: a rotation for a feature set that grew built its new container, published it, and removed the old one 0.1 s after the row was released: a rotation reads the row again before it removes the old container, and keeps it if the row changed (rotation::switch). Found in seeds 200 000 to 300 000 of a 1 000 000 run (2026-12-04)",
    ),
    (
        261757,
        &[],
        "breaker (an oracle mistake): an emptying restore took 7 of 10; rows came back before the controller's look, which weighed 5 of 10 and let them go; three other sandboxes were released after it, and the oracle, weighing the burst against the fleet as it was at the reap (7), counted 5 of 7. The oracle now weighs a burst against the larger of the fleet then and now (2026-12-04)",
    ),
    (
        198114,
        &[],
        "reap (an oracle mistake, not a controller bug): a new term's reconcile re-read a re-inserted row (a new incarnation) and sent the removal of the old incarnation's container; a restore put that incarnation back 32 ms later, before the removal landed. The oracle now judges such a removal on the row as it was when sent, as it did for a row that went in transit (found in seeds 100 000 to 200 000 of a 1 000 000 run, 2026-12-04)",
    ),
    (
        474488,
        &[],
        "reap (an oracle mistake): the same restore overtaking a removal in transit (2026-12-04)",
    ),
    (
        1503,
        &[],
        "liveness: a heal's warm-pool claim whose recording committed but reported failure removed the pool container, and the removal failed; the process knew no claim of it, no relist removed it, and it was left after its sandbox went: a pool container a failed claim cannot remove, and whose claim the process does not know, is removed by the next relist (pool::discard; first world with warm pools)",
    ),
    (
        791,
        &[],
        "grace (an oracle mistake): a claim set the claimant's credentials, failed at the rename and could not remove the container, and the cold start that followed carries the same credential token; the failed claim's container, removed as a twin just after the row went, counted as published. Grace now protects the published token on the published host port (first world with warm pools)",
    ),
    (
        9428,
        &[],
        "credentials: a create's claim of a pool container failed and its container could not be removed; the cold start that followed carried the claim's credential token, so after the world killed the cold container the claim's late rename made the leftover pass for the published one, and the heal kept it with credentials it never got. Each start after a failed one now draws a token of its own (controller::start::run; first worlds with forks and seeds; the extra draw changes this seed's world, so controller::tests::start pins the case)",
    ),
    (
        28,
        &[],
        "quota: a sandbox requested again (a new incarnation of its id) was admitted on the strength of what the id held before (containers waiting out their grace, a status of the earlier incarnation), over its owner's quota. The ledger holds a sandbox's engines for an incarnation, and only the row's own count against its owner (domain::admission, controller::admission::serves; first worlds with quotas)",
    ),
    (
        30,
        &[],
        "quota: the same, in another world: same fix (first worlds with quotas)",
    ),
    (
        1530,
        &[],
        "liveness: a sandbox re-creating what it held (its container renamed behind its back) waited behind an earlier row of its owner that waited for the room it held: neither was ever admitted. A sandbox that adds no engine is admitted at once (domain::admission::Ledger::admit; first worlds with quotas)",
    ),
    (
        4742,
        &[],
        "quota: a new leader's first relist took a row restored from an older copy for unwanted because its status still said terminating, and admitted another row in its room. The rebuild judges a row wanted as a reconcile does (plan::wanted_until; first worlds with quotas)",
    ),
    (
        4173,
        &[],
        "liveness: a process wrote a data-file seed's volume and remembered it; another leader's relist removed it as named by no row; leading again, the first process mounted the volume it remembered and every start was refused. A start that fails forgets the data file it started from, so the next writes it again (controller::start::forget; first worlds with data files)",
    ),
];

/// Seeds of the current workload that still fail, each with the
/// invariant it breaks and what is known: open bugs (or oracle
/// mistakes) not yet fixed. The CI test fails if any other seed fails,
/// or if one of these stops failing (then it moves to [`REGRESSIONS`]).
pub const OPEN: &[(u64, &str, &str)] = &[];
