//! Which containers a state database may touch, and which names it may
//! take: tables of the ownership decision.

use super::*;
use crate::domain::container::ContainerState;
use crate::domain::id::{ContainerId, Deployment, SandboxId};
use crate::domain::labels::ContainerLabels;
use crate::domain::plan::{Provision, ProvisionReason, ReapReason, Teardown, Wanted};
use crate::domain::sandbox::{Phase, ServiceStatus};
use crate::domain::secret::Secret;
use chrono::{TimeZone, Utc};
use std::collections::BTreeMap;

const OURS: &str = "11111111-1111-4111-8111-111111111111";
const THEIRS: &str = "22222222-2222-4222-8222-222222222222";

fn state() -> StateId {
    StateId::parse(OURS).unwrap()
}

fn engine(name: &'static str) -> EngineName {
    EngineName::of_engine(name)
}

/// A redis container with instance token `instance`, labelled with
/// `state_id` (or not at all).
fn container(id: &str, engine: &str, instance: &str, state_id: Option<&str>) -> ObservedContainer {
    ObservedContainer {
        id: ContainerId::new(id),
        name: format!("sandboxd.test.sb-1.{engine}"),
        labels: ContainerLabels {
            deployment: Deployment::parse("test").unwrap(),
            sandbox: SandboxId::parse("sb-1").unwrap(),
            owner: "ci".into(),
            engine: engine.into(),
            generation: 1,
            features: Default::default(),
            instance: instance.into(),
            state_id: state_id.map(str::to_owned),
            incarnation: None,
            isolation: Default::default(),
            seed: None,
        },
        state: ContainerState::Running,
        created: Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap(),
        host_port: None,
        networks: Vec::new(),
        paused: false,
    }
}

/// This database's status row, publishing `instances` for redis.
fn status(instance: &str) -> SandboxStatus {
    SandboxStatus {
        id: SandboxId::parse("sb-1").unwrap(),
        phase: Phase::Ready,
        observed_generation: 1,
        message: String::new(),
        services: BTreeMap::from([(
            "redis".to_owned(),
            Box::new(ServiceStatus {
                host: "redis".into(),
                port: 6379,
                host_port: 1,
                user: "default".into(),
                password: Secret::new("pw".to_owned()),
                database: "0".into(),
                url: "redis://redis".into(),
                env: BTreeMap::new(),
                available_extensions: Vec::new(),
                instance: instance.into(),
                ready_at: None,
                heals: 0,
                image: String::new(),
                node: None,
                seed: None,
            }),
        )]),
        network: None,
        updated_at: None,
        incarnation: None,
    }
}

#[test]
fn the_ownership_table_holds() {
    let table: Vec<(&str, ObservedContainer, Option<SandboxStatus>, bool)> = vec![
        (
            "labelled with this database's identity",
            container("c1", "redis", "i1", Some(OURS)),
            None,
            true,
        ),
        (
            "labelled with this identity, whatever the status says",
            container("c1", "redis", "i1", Some(OURS)),
            Some(status("other")),
            true,
        ),
        (
            "labelled with another identity",
            container("c1", "redis", "i1", Some(THEIRS)),
            None,
            false,
        ),
        (
            "labelled with another identity even when this status publishes its token",
            container("c1", "redis", "i1", Some(THEIRS)),
            Some(status("i1")),
            false,
        ),
        (
            "unlabelled and published by this database's status",
            container("c1", "redis", "i1", None),
            Some(status("i1")),
            true,
        ),
        (
            "unlabelled and this database has no status for it",
            container("c1", "redis", "i1", None),
            None,
            false,
        ),
        (
            "unlabelled and this database published another container",
            container("c1", "redis", "i1", None),
            Some(status("i2")),
            false,
        ),
        (
            "unlabelled without a token never matches an empty one",
            container("c1", "redis", "", None),
            Some(status("")),
            false,
        ),
    ];
    for (name, c, status, ours) in table {
        assert_eq!(is_ours(&c, &state(), status.as_ref()), ours, "{name}");
    }
}

#[test]
fn partition_keeps_every_container_on_exactly_one_side() {
    let observed = vec![
        container("c1", "redis", "i1", Some(OURS)),
        container("c2", "postgres", "i2", Some(THEIRS)),
        container("c3", "mongo", "i3", None),
    ];
    let (ours, foreign) = partition(observed, &state(), None);
    let ids = |v: &[ObservedContainer]| {
        v.iter()
            .map(|c| c.id.as_str().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&ours), ["c1"]);
    assert_eq!(ids(&foreign), ["c2", "c3"]);
}

#[test]
fn identities_and_incarnations_are_uuids_as_postgres_prints_them() {
    assert!(StateId::parse(OURS).is_ok());
    assert!(Incarnation::parse(THEIRS).is_ok());
    for bad in [
        "",
        "11111111111141118111111111111111",
        "11111111-1111-4111-8111-11111111111",
        "11111111-1111-4111-8111-1111111111111",
        "11111111-1111-4111-8111_111111111111",
        "AAAAAAAA-1111-4111-8111-111111111111",
        "g1111111-1111-4111-8111-111111111111",
        "11111111-1111-4111-8111-11111111111\n",
    ] {
        let err = StateId::parse(bad).unwrap_err();
        assert!(err.to_string().contains("expected a uuid"), "{bad:?}");
        assert!(Incarnation::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn networks_and_volumes_of_another_identity_are_never_ours_to_remove() {
    assert!(resource_is_ours(Some(OURS), &state()));
    assert!(!resource_is_ours(Some(THEIRS), &state()));
    assert!(!resource_is_ours(Some(""), &state()));
    assert!(
        resource_is_ours(None, &state()),
        "created before identities: treated as before"
    );
}

#[test]
fn the_mount_table_holds() {
    let labels = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let (d, s, st, inc) = (
        labels::DEPLOYMENT,
        labels::SANDBOX,
        labels::STATE_ID,
        labels::INCARNATION,
    );
    let wanted = labels(&[(d, "prod"), (s, "sb-1"), (st, OURS), (inc, "new")]);
    let table: Vec<(&str, HashMap<String, String>, bool)> = vec![
        ("its own volume", wanted.clone(), true),
        (
            "a volume from before identities and incarnations is adopted",
            labels(&[(d, "prod"), (s, "sb-1")]),
            true,
        ),
        (
            "an older incarnation's data is never mounted",
            labels(&[(d, "prod"), (s, "sb-1"), (st, OURS), (inc, "old")]),
            false,
        ),
        (
            "another state database's data is never mounted",
            labels(&[(d, "prod"), (s, "sb-1"), (st, THEIRS), (inc, "new")]),
            false,
        ),
        (
            "another sandbox's volume",
            labels(&[(d, "prod"), (s, "sb-2"), (st, OURS), (inc, "new")]),
            false,
        ),
        (
            "another deployment's volume",
            labels(&[(d, "staging"), (s, "sb-1")]),
            false,
        ),
        ("a volume sandboxd did not create", labels(&[]), false),
    ];
    for (name, existing, ok) in table {
        assert_eq!(may_mount(&existing, &wanted), ok, "{name}");
    }
}

#[test]
fn the_name_takeover_table_holds() {
    let labels = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let (d, s, e, st) = (
        labels::DEPLOYMENT,
        labels::SANDBOX,
        labels::ENGINE,
        labels::STATE_ID,
    );
    let wanted = labels(&[(d, "prod"), (s, "sb-1"), (e, "redis"), (st, OURS)]);
    let table: Vec<(&str, HashMap<String, String>, bool)> = vec![
        ("this database's earlier container", wanted.clone(), true),
        (
            "a container from before identities (the plan vouched for it)",
            labels(&[(d, "prod"), (s, "sb-1"), (e, "redis")]),
            true,
        ),
        (
            "another state database's container",
            labels(&[(d, "prod"), (s, "sb-1"), (e, "redis"), (st, THEIRS)]),
            false,
        ),
        (
            "another sandbox's container",
            labels(&[(d, "prod"), (s, "sb-2"), (e, "redis"), (st, OURS)]),
            false,
        ),
        (
            "another engine's container",
            labels(&[(d, "prod"), (s, "sb-1"), (e, "valkey"), (st, OURS)]),
            false,
        ),
        ("a container sandboxd did not create", labels(&[]), false),
    ];
    for (name, existing, ok) in table {
        assert_eq!(may_replace(&existing, &wanted), ok, "{name}");
    }
}

fn provision(name: &'static str) -> Action {
    Action::Provision(Provision {
        engine: engine(name),
        features: Default::default(),
        reuse: None,
        host_port: None,
        replace: Vec::new(),
        retire: None,
        reason: ProvisionReason::Create,
        seed: None,
    })
}

#[test]
fn a_provision_whose_name_a_foreign_container_holds_is_taken_out_with_a_message_saying_what_to_do()
{
    let mut plan = Plan {
        wanted: Wanted::Yes,
        actions: vec![
            provision("postgres"),
            provision("redis"),
            Action::Teardown(Teardown {
                container: ContainerId::new("c9"),
                engine: "mongo".into(),
                reason: ReapReason::ServiceDropped,
            }),
        ],
        recheck_at: None,
        data_kept_until: None,
        pause: false,
    };
    let foreign = [
        container("f1", "redis", "i1", Some(THEIRS)),
        container("f2", "mongo", "i2", None),
    ];
    let held = hold_names_held_by_foreign(&mut plan, &foreign, &state());

    assert_eq!(
        plan.provisions().map(|p| p.engine).collect::<Vec<_>>(),
        [engine("postgres")]
    );
    assert_eq!(plan.teardowns().count(), 1, "other actions stay");
    assert_eq!(held.len(), 1);
    let (e, message) = &held[0];
    assert_eq!(*e, engine("redis"));
    for fragment in [
        "not provisioned",
        "sandboxd.test.sb-1.redis",
        THEIRS,
        OURS,
        "docker rm -f sandboxd.test.sb-1.redis",
        "another sandbox id",
    ] {
        assert!(message.contains(fragment), "{fragment}: {message}");
    }
}

#[test]
fn an_unlabelled_foreign_holder_is_named_as_one_from_before_identities() {
    let mut plan = Plan {
        wanted: Wanted::Yes,
        actions: vec![provision("mongo")],
        recheck_at: None,
        data_kept_until: None,
        pause: false,
    };
    let held =
        hold_names_held_by_foreign(&mut plan, &[container("f2", "mongo", "i2", None)], &state());
    assert!(plan.actions.is_empty());
    assert!(
        held[0].1.contains("before state database identities"),
        "{}",
        held[0].1
    );
}

#[test]
fn without_foreign_containers_the_plan_is_untouched() {
    let mut plan = Plan {
        wanted: Wanted::Yes,
        actions: vec![provision("postgres"), provision("redis")],
        recheck_at: None,
        data_kept_until: None,
        pause: false,
    };
    let before = plan.clone();
    assert!(hold_names_held_by_foreign(&mut plan, &[], &state()).is_empty());
    assert_eq!(plan, before);
}
