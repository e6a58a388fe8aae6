//! Admission decisions: quotas, the host's budget, arrival order, all or
//! nothing.

use super::*;
use chrono::TimeZone;

const MIB: u64 = 1 << 20;
const ENGINE: u64 = 512 * MIB;

fn id(s: &str) -> SandboxId {
    SandboxId::parse(s).unwrap()
}

fn at(second: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, second).unwrap()
}

fn ask(name: &str, second: u32, owner: &str, engines: &[&str]) -> Ask {
    Ask {
        arrival: Arrival {
            at: at(second),
            id: id(name),
        },
        owner: owner.into(),
        engines: engines.iter().map(|e| (*e).to_owned()).collect(),
        incarnation: None,
    }
}

fn limit(sandboxes: Option<u64>, memory: Option<u64>) -> Quota {
    Quota {
        sandboxes,
        memory_bytes: memory,
    }
}

fn message(d: &Decision) -> &str {
    match d {
        Decision::Admit => "",
        Decision::Wait { message, .. } => message,
    }
}

fn reason(d: &Decision) -> Option<WaitReason> {
    match d {
        Decision::Admit => None,
        Decision::Wait { reason, .. } => Some(*reason),
    }
}

#[test]
fn a_third_row_over_the_owner_limit_of_two_waits_with_the_limit_and_the_use() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let quota = limit(Some(2), None);
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    assert_eq!(
        ledger.admit(&ask("b", 2, "alice", &["redis"]), quota),
        Decision::Admit
    );
    let third = ledger.admit(&ask("c", 3, "alice", &["postgres"]), quota);
    assert_eq!(reason(&third), Some(WaitReason::Owner));
    assert_eq!(
        message(&third),
        "waiting for quota: owner 'alice' has 2 of 2 sandboxes and 1 GiB of unlimited memory (limit sandboxes=2); admitted when one of its sandboxes is released"
    );
    // Another owner is not held back.
    assert_eq!(
        ledger.admit(&ask("d", 4, "bob", &["postgres"]), quota),
        Decision::Admit
    );
    assert_eq!(ledger.waiting(), 1);
}

#[test]
fn a_released_sandbox_makes_room_and_the_waiting_row_is_the_head() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let quota = limit(Some(1), None);
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    assert!(ledger.admit(&ask("b", 2, "alice", &["postgres"]), quota) != Decision::Admit);
    assert_eq!(ledger.heads(), vec![id("b")]);
    // Released: its containers wait out the grace window, no longer the owner's.
    assert!(ledger.settle(
        &id("a"),
        "alice",
        false,
        None,
        ["postgres".to_owned()].into()
    ));
    assert_eq!(
        ledger.admit(&ask("b", 2, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    assert_eq!(ledger.waiting(), 0);
    // The host still counts the released one's container until it is removed.
    assert_eq!(ledger.admitted_bytes(), 2 * ENGINE);
    assert!(ledger.settle(&id("a"), "alice", false, None, BTreeSet::new()));
    assert_eq!(ledger.admitted_bytes(), ENGINE);
}

#[test]
fn the_owner_memory_limit_counts_the_sum_of_the_caps() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let quota = limit(None, Some(1024 * MIB));
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    let d = ledger.admit(&ask("b", 2, "alice", &["postgres", "redis"]), quota);
    assert_eq!(
        message(&d),
        "waiting for quota: owner 'alice' has 1 of unlimited sandboxes and 512 MiB of 1 GiB memory (limit memory=1 GiB), this sandbox needs 1 GiB; admitted when some of the owner's memory is released"
    );
}

#[test]
fn the_host_budget_refuses_what_would_overcommit_it_all_or_nothing() {
    // 1.5 engines' worth: one engine fits, a second does not.
    let mut ledger = Ledger::new(ENGINE, 0, Some(768 * MIB));
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), Quota::default()),
        Decision::Admit
    );
    let d = ledger.admit(&ask("b", 2, "bob", &["redis"]), Quota::default());
    assert_eq!(reason(&d), Some(WaitReason::Budget));
    assert_eq!(
        message(&d),
        "waiting for the host's memory budget: 512 MiB of 768 MiB in use, this sandbox needs 512 MiB; admitted when memory is released"
    );
    // Nothing of it is counted.
    assert_eq!(ledger.admitted_bytes(), ENGINE);
}

#[test]
fn a_sandbox_of_two_engines_where_only_one_fits_gets_neither() {
    let mut ledger = Ledger::new(ENGINE, 0, Some(768 * MIB));
    let d = ledger.admit(
        &ask("a", 1, "alice", &["postgres", "redis"]),
        Quota::default(),
    );
    assert_eq!(reason(&d), Some(WaitReason::Never));
    assert!(
        message(&d).contains("needs 1 GiB and the whole budget is 768 MiB"),
        "{}",
        message(&d)
    );
    assert_eq!(ledger.admitted_bytes(), 0);
    // It holds no one back.
    assert_eq!(
        ledger.admit(&ask("b", 2, "bob", &["redis"]), Quota::default()),
        Decision::Admit
    );
}

#[test]
fn warm_pools_count_against_the_host_budget() {
    let mut ledger = Ledger::new(ENGINE, ENGINE, Some(1024 * MIB));
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), Quota::default()),
        Decision::Admit
    );
    let d = ledger.admit(&ask("b", 2, "bob", &["postgres"]), Quota::default());
    assert!(
        message(&d).contains("1 GiB of 1 GiB in use"),
        "{}",
        message(&d)
    );
}

#[test]
fn a_later_row_does_not_overtake_an_earlier_row_of_its_owner_that_waits() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let quota = limit(None, Some(1024 * MIB));
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    // b needs two engines: it waits for memory.
    assert!(ledger.admit(&ask("b", 2, "alice", &["postgres", "redis"]), quota) != Decision::Admit);
    // c would fit, but b came first.
    let c = ledger.admit(&ask("c", 3, "alice", &["redis"]), quota);
    assert_eq!(reason(&c), Some(WaitReason::Owner));
    assert!(
        message(&c).starts_with("waiting for quota: behind 'b', an earlier row of owner 'alice'"),
        "{}",
        message(&c)
    );
    assert_eq!(ledger.heads(), vec![id("b")]);
    ledger.settle(&id("a"), "alice", true, None, BTreeSet::new());
    assert_eq!(
        ledger.admit(&ask("b", 2, "alice", &["postgres", "redis"]), quota),
        Decision::Admit
    );
    assert_eq!(ledger.heads(), vec![id("c")]);
}

/// A sandbox that re-creates only what it holds (its container renamed
/// or killed behind sandboxd's back) takes no room: it is admitted even
/// behind an earlier row that waits for the room it holds, which would
/// otherwise wait for it for ever. (The simulation found it: seed 1530.)
#[test]
fn a_sandbox_that_recreates_what_it_holds_is_not_held_back_by_an_earlier_waiting_row() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let quota = limit(Some(1), None);
    assert_eq!(
        ledger.admit(&ask("late", 5, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    let early = ledger.admit(&ask("early", 1, "alice", &["postgres"]), quota);
    assert_eq!(reason(&early), Some(WaitReason::Owner));
    assert_eq!(
        ledger.admit(&ask("late", 5, "alice", &["postgres"]), quota),
        Decision::Admit,
        "it holds postgres already"
    );
    let grows = ledger.admit(&ask("late", 5, "alice", &["postgres", "redis"]), quota);
    assert_eq!(
        reason(&grows),
        Some(WaitReason::Owner),
        "a new engine does wait behind the earlier row"
    );
}

#[test]
fn a_later_row_does_not_overtake_an_earlier_one_waiting_for_the_host_budget() {
    let mut ledger = Ledger::new(ENGINE, 0, Some(1024 * MIB));
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), Quota::default()),
        Decision::Admit
    );
    assert!(
        ledger.admit(
            &ask("b", 2, "bob", &["postgres", "redis"]),
            Quota::default()
        ) != Decision::Admit
    );
    let c = ledger.admit(&ask("c", 3, "carol", &["redis"]), Quota::default());
    assert_eq!(reason(&c), Some(WaitReason::Budget));
    assert!(message(&c).contains("behind 'b'"), "{}", message(&c));
}

#[test]
fn a_row_waiting_for_its_owner_does_not_hold_back_other_owners() {
    let mut ledger = Ledger::new(ENGINE, 0, Some(4 * ENGINE));
    let one = limit(Some(1), None);
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), one),
        Decision::Admit
    );
    assert_eq!(
        reason(&ledger.admit(&ask("b", 2, "alice", &["postgres"]), one)),
        Some(WaitReason::Owner)
    );
    assert_eq!(
        ledger.admit(&ask("c", 3, "bob", &["postgres"]), one),
        Decision::Admit
    );
}

#[test]
fn growing_an_admitted_sandbox_asks_for_the_added_memory_only() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let quota = limit(Some(1), Some(1024 * MIB));
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["postgres"]), quota),
        Decision::Admit
    );
    // The sandbox count does not grow; the memory does, and fits.
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["redis"]), quota),
        Decision::Admit
    );
    let d = ledger.admit(&ask("a", 1, "alice", &["mongo"]), quota);
    assert!(
        message(&d).contains("with its new engines this sandbox needs 1.5 GiB"),
        "{}",
        message(&d)
    );
    // What it holds is unchanged.
    assert_eq!(ledger.usage()["alice"].memory_bytes, 1024 * MIB);
}

#[test]
fn a_lowered_limit_evicts_nothing_and_holds_back_new_rows() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    for (n, name) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(
            ledger.admit(&ask(name, n as u32, "alice", &["redis"]), Quota::default()),
            Decision::Admit
        );
    }
    let d = ledger.admit(&ask("d", 9, "alice", &["redis"]), limit(Some(1), None));
    assert!(
        message(&d).contains("has 3 of 1 sandboxes"),
        "{}",
        message(&d)
    );
    assert_eq!(ledger.usage()["alice"].sandboxes, 3);
}

#[test]
fn a_limit_of_zero_sandboxes_never_admits_and_says_so() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    let d = ledger.admit(&ask("a", 1, "alice", &["redis"]), limit(Some(0), None));
    assert_eq!(reason(&d), Some(WaitReason::Never));
    assert!(message(&d).contains("limit sandboxes=0"));
    assert!(ledger.heads().is_empty());
}

#[test]
fn rows_not_judged_yet_after_a_rebuild_keep_their_room_ahead_of_later_rows() {
    let mut ledger = Ledger::new(ENGINE, 0, Some(2 * ENGINE));
    ledger.rebuild(
        [(
            id("a"),
            (
                "alice".to_owned(),
                true,
                None,
                BTreeSet::from(["postgres".to_owned()]),
            ),
        )],
        [
            (
                Arrival {
                    at: at(2),
                    id: id("b"),
                },
                "bob".to_owned(),
                1,
            ),
            (
                Arrival {
                    at: at(1),
                    id: id("a"),
                },
                "alice".to_owned(),
                1,
            ),
        ],
    );
    // a holds already: not waiting.
    assert_eq!(ledger.waiting(), 1);
    assert_eq!(ledger.admitted_bytes(), ENGINE);
    let c = ledger.admit(&ask("c", 3, "carol", &["redis"]), Quota::default());
    assert!(
        message(&c).contains("kept for earlier rows that sandboxd has not looked at"),
        "{}",
        message(&c)
    );
    assert_eq!(
        ledger.admit(&ask("b", 2, "bob", &["redis"]), Quota::default()),
        Decision::Admit
    );
    let c = ledger.admit(&ask("c", 3, "carol", &["redis"]), Quota::default());
    assert!(
        message(&c).contains("1 GiB of 1 GiB in use"),
        "{}",
        message(&c)
    );
}

#[test]
fn a_row_not_judged_yet_holds_no_one_back_while_there_is_room_for_both() {
    let mut ledger = Ledger::new(ENGINE, 0, Some(4 * ENGINE));
    ledger.rebuild(
        [],
        [(
            Arrival {
                at: at(1),
                id: id("broken"),
            },
            "alice".to_owned(),
            1,
        )],
    );
    assert_eq!(
        ledger.admit(&ask("b", 2, "alice", &["redis"]), limit(Some(2), None)),
        Decision::Admit
    );
    // Its owner's last slot is kept for it.
    let c = ledger.admit(&ask("c", 3, "alice", &["redis"]), limit(Some(2), None));
    assert_eq!(reason(&c), Some(WaitReason::Owner));
    // A row that is never judged (its reconcile keeps failing) keeps its
    // room until the next relist.
    let mark = ledger.mark();
    ledger.prune(mark, |_| true);
    assert_eq!(
        ledger.admit(&ask("c", 3, "alice", &["redis"]), limit(Some(2), None)),
        Decision::Admit
    );
}

#[test]
fn a_relist_prunes_what_it_found_no_trace_of_unless_it_changed_since() {
    let mut ledger = Ledger::new(ENGINE, 0, None);
    assert_eq!(
        ledger.admit(&ask("a", 1, "alice", &["redis"]), Quota::default()),
        Decision::Admit
    );
    let mark = ledger.mark();
    assert_eq!(
        ledger.admit(&ask("b", 2, "alice", &["redis"]), Quota::default()),
        Decision::Admit
    );
    ledger.prune(mark, |_| false);
    assert_eq!(
        ledger.usage()["alice"].sandboxes,
        1,
        "b was admitted after the lists were taken"
    );
}

#[test]
fn sizes_are_shown_and_read_in_binary_units() {
    for (bytes, shown) in [
        (0, "0 B"),
        (512 * MIB, "512 MiB"),
        (1024 * MIB, "1 GiB"),
        (1536 * MIB, "1.5 GiB"),
        (23 * 1024 * MIB, "23 GiB"),
    ] {
        assert_eq!(Bytes(bytes).to_string(), shown);
    }
    for (text, bytes) in [
        ("4GiB", Some(4 << 30)),
        ("1.5 GiB", Some(1536 * MIB)),
        ("512M", Some(512 * MIB)),
        ("1000", Some(1000)),
        ("-1G", None),
        ("lots", None),
        ("1XB", None),
    ] {
        assert_eq!(parse_bytes(text), bytes, "{text}");
    }
}

fn update(phase: Phase, services: &[&str]) -> StatusUpdate {
    use crate::domain::sandbox::ServiceStatus;
    use crate::domain::secret::Secret;
    StatusUpdate {
        phase,
        observed_generation: 3,
        message: String::new(),
        services: services
            .iter()
            .map(|e| {
                let s = ServiceStatus {
                    host: (*e).into(),
                    port: 1,
                    host_port: 2,
                    user: "u".into(),
                    password: Secret::new("p"),
                    database: "d".into(),
                    url: String::new(),
                    env: Default::default(),
                    available_extensions: vec![],
                    instance: String::new(),
                    ready_at: None,
                    heals: 0,
                    image: String::new(),
                    node: None,
                    seed: None,
                };
                ((*e).to_owned(), Box::new(s))
            })
            .collect(),
        network: None,
        incarnation: None,
    }
}

#[test]
fn a_row_that_holds_nothing_stays_pending_with_the_message_and_its_generation_unobserved() {
    let mut u = update(Phase::Ready, &[]);
    waiting_status(&mut u, 0, "waiting for quota: x");
    assert_eq!(u.phase, Phase::Pending);
    assert_eq!(u.message, "waiting for quota: x");
    assert_eq!(u.observed_generation, 0);
}

#[test]
fn a_running_sandbox_that_asks_for_more_stays_ready_with_what_it_has() {
    let mut u = update(Phase::Ready, &["postgres"]);
    waiting_status(&mut u, 2, "waiting for quota: x");
    assert_eq!(u.phase, Phase::Ready);
    assert_eq!(u.services.len(), 1);
    assert_eq!(
        u.message,
        "ready; its new engines are not created: waiting for quota: x"
    );
    assert_eq!(u.observed_generation, 2);
}

/// What the running totals must equal: recomputed from what is held and
/// who waits.
fn recomputed(ledger: &Ledger) -> (BTreeMap<String, Use>, u64) {
    let mut usage: BTreeMap<String, Use> = BTreeMap::new();
    let mut engines = 0;
    for h in ledger.held.values() {
        engines += h.engines.len() as u64;
        if h.wanted {
            let u = usage.entry(h.owner.clone()).or_default();
            u.sandboxes += 1;
            u.memory_bytes += h.engines.len() as u64 * ledger.engine_bytes;
        }
    }
    for w in ledger.waiting.values() {
        usage.entry(w.owner.clone()).or_default().waiting += 1;
    }
    (usage, engines)
}

#[test]
fn the_running_totals_match_what_the_ledger_holds_after_any_sequence_of_changes() {
    let mut ledger = Ledger::new(ENGINE, 0, Some(6 * ENGINE));
    let owners = ["alice", "bob", "carol"];
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    let engines = ["postgres", "redis", "valkey"];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for step in 0..2000 {
        let name = names[next(names.len())];
        let owner = owners[next(owners.len())];
        let picked: Vec<&str> = engines.iter().copied().filter(|_| next(2) == 0).collect();
        match next(6) {
            0 | 1 => {
                let quota = limit(Some(next(4) as u64), Some(next(5) as u64 * ENGINE));
                ledger.admit(&ask(name, next(60) as u32, owner, &picked), quota);
            }
            2 | 3 => {
                let set = picked.iter().map(|e| (*e).to_owned()).collect();
                ledger.settle(&id(name), owner, next(3) > 0, None, set);
            }
            4 => {
                ledger.forget_waiter(&id(name));
            }
            _ => {
                let mark = ledger.mark();
                let keep = next(names.len());
                ledger.prune(mark, |s| s.as_str() != names[keep]);
            }
        }
        let (usage, engines) = recomputed(&ledger);
        assert_eq!(ledger.usage(), usage, "step {step}");
        assert_eq!(ledger.engines, engines, "step {step}");
    }
    let changed = ledger.take_changed();
    assert!(!changed.is_empty());
    assert!(ledger.take_changed().is_empty());
}
