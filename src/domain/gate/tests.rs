//! The gates as tables: a plan and the facts looked up for it, in; the
//! actions let through and what is held, out.

use super::*;
use crate::domain::container::ContainerState;
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::labels::ContainerLabels;
use crate::domain::plan::{ReapReason, Teardown};
use chrono::TimeZone;
use std::collections::BTreeSet;

const OURS: &str = "11111111-1111-4111-8111-111111111111";
const THEIRS: &str = "22222222-2222-4222-8222-222222222222";

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
}

fn ago(seconds: i64) -> DateTime<Utc> {
    now() - chrono::Duration::seconds(seconds)
}

fn engine(name: &'static str) -> EngineName {
    EngineName::of_engine(name)
}

fn provision(name: &'static str, reason: ProvisionReason) -> Action {
    Action::Provision(Provision {
        engine: engine(name),
        features: BTreeSet::new(),
        reuse: None,
        host_port: None,
        replace: Vec::new(),
        retire: None,
        reason,
        seed: None,
    })
}

fn create(name: &'static str) -> Action {
    provision(name, ProvisionReason::Create)
}

fn heal(name: &'static str) -> Action {
    provision(name, ProvisionReason::Heal)
}

fn rotate(name: &'static str) -> Action {
    provision(name, ProvisionReason::Rotate)
}

fn teardown(id: &str) -> Action {
    Action::Teardown(Teardown {
        container: ContainerId::new(id),
        engine: "redis".into(),
        reason: ReapReason::Deleted,
    })
}

fn plan(wanted: Wanted, actions: Vec<Action>) -> Plan {
    Plan {
        wanted,
        actions,
        recheck_at: None,
        data_kept_until: None,
        pause: false,
    }
}

/// Another state database's `engine` container of the sandbox.
fn foreign(engine: &str) -> ObservedContainer {
    ObservedContainer {
        id: ContainerId::new(format!("theirs-{engine}")),
        name: format!("sandboxd.test.sb-1.{engine}"),
        labels: ContainerLabels {
            deployment: Deployment::parse("test").unwrap(),
            sandbox: SandboxId::parse("sb-1").unwrap(),
            owner: "ci".into(),
            engine: engine.into(),
            generation: 1,
            features: Default::default(),
            instance: "t".into(),
            state_id: Some(THEIRS.to_owned()),
            incarnation: None,
            isolation: Default::default(),
            seed: None,
        },
        state: ContainerState::Running,
        created: ago(3600),
        host_port: None,
        networks: Vec::new(),
        paused: false,
    }
}

/// Facts that hold nothing back; each case changes what it needs.
struct Case {
    admission: Admission,
    images: Vec<(&'static str, Image)>,
    heals: Vec<(&'static str, Vec<DateTime<Utc>>)>,
    causes: Vec<(&'static str, HealCause)>,
    foreign: Vec<ObservedContainer>,
    reaping: Reaping,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            admission: Admission::Go,
            images: Vec::new(),
            heals: Vec::new(),
            causes: Vec::new(),
            foreign: Vec::new(),
            reaping: Reaping::Go,
        }
    }
}

fn run(plan: Plan, case: Case) -> Gated {
    let policy = CrashLoopPolicy::default();
    let state = StateId::parse(OURS).unwrap();
    let facts = Facts {
        admission: case.admission,
        images: case
            .images
            .into_iter()
            .map(|(e, i)| (engine(e), i))
            .collect(),
        heals: case
            .heals
            .into_iter()
            .map(|(e, h)| (engine(e), h))
            .collect(),
        causes: case
            .causes
            .into_iter()
            .map(|(e, c)| (engine(e), c))
            .collect(),
        crash_loop: &policy,
        now: now(),
        foreign: &case.foreign,
        state: &state,
        reaping: case.reaping,
    };
    gate(plan, &facts)
}

fn wait(message: &str) -> Admission {
    Admission::Wait(message.to_owned())
}

#[test]
fn each_gate_lets_through_what_it_has_no_reason_to_hold() {
    // (name, plan's actions, facts) → actions let through
    let rows: Vec<(&str, Vec<Action>, Case, Vec<Action>)> = vec![
        (
            "nothing held: the plan goes as it is",
            vec![create("redis"), heal("postgres")],
            Case::default(),
            vec![create("redis"), heal("postgres")],
        ),
        (
            "admission waits: every create goes, the heal and the rotation stay",
            vec![create("redis"), heal("postgres"), rotate("valkey")],
            Case {
                admission: wait("quota"),
                ..Case::default()
            },
            vec![heal("postgres"), rotate("valkey")],
        ),
        (
            "an image being fetched holds its engine only",
            vec![create("redis"), create("postgres")],
            Case {
                images: vec![("redis", Image::Fetching("pulling".into()))],
                ..Case::default()
            },
            vec![create("postgres")],
        ),
        (
            "an image that failed holds its engine only",
            vec![create("redis"), create("postgres")],
            Case {
                images: vec![("postgres", Image::Failed("no such image".into()))],
                ..Case::default()
            },
            vec![create("redis")],
        ),
        (
            "a heal due now goes",
            vec![heal("redis")],
            Case {
                heals: vec![("redis", vec![ago(3600)])],
                ..Case::default()
            },
            vec![heal("redis")],
        ),
        (
            "a heal right after another waits for its back-off",
            vec![heal("redis"), create("postgres")],
            Case {
                heals: vec![("redis", vec![ago(1)])],
                ..Case::default()
            },
            vec![create("postgres")],
        ),
        (
            "a create is not a heal: the back-off does not hold it",
            vec![create("redis")],
            Case {
                heals: vec![("redis", vec![ago(1)])],
                ..Case::default()
            },
            vec![create("redis")],
        ),
        (
            "a name another state database holds holds that engine",
            vec![create("redis"), create("postgres")],
            Case {
                foreign: vec![foreign("redis")],
                ..Case::default()
            },
            vec![create("postgres")],
        ),
        (
            "a held reap keeps its teardowns in the plan (the reconcile stops before acting)",
            vec![teardown("c1")],
            Case {
                reaping: Reaping::Paused,
                ..Case::default()
            },
            vec![teardown("c1")],
        ),
    ];
    for (name, actions, case, expected) in rows {
        let gated = run(plan(Wanted::Yes, actions), case);
        assert_eq!(gated.plan.actions, expected, "{name}");
    }
}

#[test]
fn a_create_waiting_for_admission_is_not_admitted_and_says_why() {
    let gated = run(
        plan(Wanted::Yes, vec![create("redis"), heal("postgres")]),
        Case {
            admission: wait("owner ci is at its quota of 2 sandboxes"),
            ..Case::default()
        },
    );
    assert_eq!(
        gated.held.admission.as_deref(),
        Some("owner ci is at its quota of 2 sandboxes")
    );
    assert!(gated.held.admitted.is_empty());
}

#[test]
fn an_admitted_create_stays_admitted_while_its_image_is_fetched() {
    let gated = run(
        plan(Wanted::Yes, vec![create("postgres"), create("redis")]),
        Case {
            images: vec![("redis", Image::Fetching("waiting for image redis:7".into()))],
            ..Case::default()
        },
    );
    assert_eq!(gated.held.admitted, ["postgres", "redis"]);
    assert_eq!(gated.held.awaiting, ["redis: waiting for image redis:7"]);
    assert!(gated.held.images_failed.is_empty());
}

#[test]
fn a_failed_image_is_reported_as_its_engines_failure() {
    let gated = run(
        plan(Wanted::Yes, vec![create("redis")]),
        Case {
            images: vec![("redis", Image::Failed("could not be pulled".into()))],
            ..Case::default()
        },
    );
    assert_eq!(
        gated.held.images_failed,
        [(engine("redis"), "could not be pulled".to_owned())]
    );
    assert!(gated.held.awaiting.is_empty());
}

#[test]
fn a_create_that_waits_for_admission_does_not_ask_for_its_image() {
    let actions = plan(Wanted::Yes, vec![create("redis"), heal("postgres")]);
    let asked = |admission: &Admission| -> Vec<EngineName> {
        admitted(&actions, admission).map(|p| p.engine).collect()
    };
    assert_eq!(asked(&Admission::Go), [engine("redis"), engine("postgres")]);
    assert_eq!(asked(&wait("budget")), [engine("postgres")]);
}

#[test]
fn heals_due_are_returned_to_be_recorded_and_held_ones_with_their_gate() {
    let many: Vec<DateTime<Utc>> = (1..=30).map(|i| ago(i * 10)).collect();
    let gated = run(
        plan(
            Wanted::Yes,
            vec![heal("mongo"), heal("postgres"), heal("redis")],
        ),
        Case {
            heals: vec![("postgres", vec![ago(1)]), ("redis", many)],
            ..Case::default()
        },
    );
    assert_eq!(gated.held.heals_due, [engine("mongo")]);
    let held: Vec<(EngineName, HealGate)> = gated.held.crash_loops.clone();
    assert_eq!(held.len(), 2);
    assert_eq!(held[0].0, engine("postgres"));
    assert!(
        matches!(held[0].1, HealGate::At { at, heals: 1 } if at > now()),
        "{held:?}"
    );
    assert!(
        matches!(held[1].1, HealGate::At { at, heals: 30 } if at <= now() + chrono::Duration::seconds(60)),
        "thirty deaths still only wait the cap: {held:?}"
    );
}

#[test]
fn orders_from_outside_are_healed_at_once_and_not_counted_whatever_came_before() {
    let many: Vec<DateTime<Utc>> = (1..=30).map(ago).collect();
    let table = [
        (HealCause::Stopped, true),
        (HealCause::Removed, true),
        (HealCause::Exited, false),
        (HealCause::Oom, false),
    ];
    for (cause, healed_now) in table {
        let gated = run(
            plan(Wanted::Yes, vec![heal("postgres")]),
            Case {
                heals: vec![("postgres", many.clone())],
                causes: vec![("postgres", cause)],
                ..Case::default()
            },
        );
        assert_eq!(
            gated.plan.provisions().count() == 1,
            healed_now,
            "{cause:?}"
        );
        assert!(
            gated.held.heals_due.is_empty(),
            "{cause:?}: recorded only when the engine's own death is healed: {:?}",
            gated.held
        );
        assert_eq!(gated.held.crash_loops.is_empty(), healed_now, "{cause:?}");
    }
}

#[test]
fn a_heal_whose_image_is_absent_does_not_count_against_its_back_off() {
    let gated = run(
        plan(Wanted::Yes, vec![heal("redis")]),
        Case {
            images: vec![("redis", Image::Fetching("pulling".into()))],
            ..Case::default()
        },
    );
    assert!(gated.held.heals_due.is_empty());
    assert!(gated.held.crash_loops.is_empty());
}

#[test]
fn a_name_held_by_another_state_database_says_whose_it_is() {
    let gated = run(
        plan(Wanted::Yes, vec![create("redis")]),
        Case {
            foreign: vec![foreign("redis")],
            ..Case::default()
        },
    );
    assert_eq!(gated.held.names.len(), 1);
    let (held, why) = &gated.held.names[0];
    assert_eq!(*held, engine("redis"));
    assert!(why.contains(THEIRS), "{why}");
}

#[test]
fn the_breaker_holds_only_the_reap_of_a_deleted_row() {
    // (name, wanted, actions, breaker) → held
    let rows = [
        (
            "paused, reaping a deleted row",
            Wanted::Deleted,
            vec![teardown("c1")],
            Reaping::Paused,
            Some(Reaping::Paused),
        ),
        (
            "unconfirmed, reaping a deleted row",
            Wanted::Deleted,
            vec![teardown("c1")],
            Reaping::Unconfirmed,
            Some(Reaping::Unconfirmed),
        ),
        (
            "the breaker lets it go",
            Wanted::Deleted,
            vec![teardown("c1")],
            Reaping::Go,
            None,
        ),
        (
            "a deleted row with nothing to reap",
            Wanted::Deleted,
            vec![],
            Reaping::Paused,
            None,
        ),
        (
            "an expired row is reaped whatever the breaker says",
            Wanted::Expired,
            vec![teardown("c1")],
            Reaping::Paused,
            None,
        ),
    ];
    for (name, wanted, actions, reaping, expected) in rows {
        let p = plan(wanted, actions);
        assert_eq!(
            reaps_deleted_row(&p),
            wanted == Wanted::Deleted && !p.actions.is_empty(),
            "{name}"
        );
        let gated = run(
            p,
            Case {
                reaping,
                ..Case::default()
            },
        );
        assert_eq!(gated.held.reaping, expected, "{name}");
    }
}
