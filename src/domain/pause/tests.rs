//! Which containers a reconcile freezes and thaws, one case per test.

use super::*;
use crate::domain::container::ContainerState;
use crate::domain::id::{Deployment, EngineName, SandboxId};
use crate::domain::labels::ContainerLabels;
use crate::domain::plan::{Action, Provision, ProvisionReason, ReapReason, Teardown};
use crate::domain::sandbox::ServiceStatus;
use crate::domain::secret::Secret;
use chrono::{TimeZone, Utc};
use std::collections::BTreeMap;

fn engine(name: &'static str) -> EngineName {
    EngineName::of_engine(name)
}

fn container(id: &str, engine: &str, instance: &str, paused: bool) -> ObservedContainer {
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
            state_id: None,
            incarnation: None,
            isolation: Default::default(),
            seed: None,
        },
        state: ContainerState::Running,
        created: Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap(),
        host_port: Some(50_000),
        networks: Vec::new(),
        paused,
    }
}

fn published(instance: &str) -> ServiceStatus {
    ServiceStatus {
        host: "h".into(),
        port: 1,
        host_port: 50_000,
        user: "u".into(),
        password: Secret::new("pw"),
        database: "db".into(),
        url: String::new(),
        env: BTreeMap::new(),
        available_extensions: Vec::new(),
        instance: instance.into(),
        ready_at: None,
        heals: 0,
        image: String::new(),
        node: None,
        seed: None,
    }
}

fn keep(name: &'static str, instance: &str) -> Action {
    Action::Keep {
        engine: engine(name),
        status: published(instance),
    }
}

fn plan(wanted: Wanted, pause: bool, actions: Vec<Action>) -> Plan {
    Plan {
        wanted,
        actions,
        recheck_at: None,
        data_kept_until: None,
        pause,
    }
}

fn ids(items: &[&str]) -> Vec<ContainerId> {
    items.iter().map(|s| ContainerId::new(*s)).collect()
}

#[test]
fn an_idle_sandbox_that_asks_to_pause_freezes_every_kept_container_not_frozen_yet() {
    let observed = [
        container("c1", "postgres", "p1", false),
        container("c2", "redis", "r1", true),
    ];
    let p = plan(
        Wanted::Yes,
        true,
        vec![keep("postgres", "p1"), keep("redis", "r1")],
    );
    assert_eq!(
        step(&p, &observed),
        Step {
            freeze: ids(&["c1"]),
            thaw: Vec::new(),
            paused: true,
        }
    );
}

#[test]
fn a_paused_sandbox_with_every_container_frozen_has_nothing_to_do() {
    let observed = [container("c1", "postgres", "p1", true)];
    let p = plan(Wanted::Yes, true, vec![keep("postgres", "p1")]);
    assert_eq!(
        step(&p, &observed),
        Step {
            freeze: Vec::new(),
            thaw: Vec::new(),
            paused: true,
        }
    );
}

#[test]
fn a_sandbox_used_again_thaws_every_frozen_container() {
    let observed = [
        container("c1", "postgres", "p1", true),
        container("c2", "redis", "r1", false),
    ];
    let p = plan(
        Wanted::Yes,
        false,
        vec![keep("postgres", "p1"), keep("redis", "r1")],
    );
    assert_eq!(
        step(&p, &observed),
        Step {
            freeze: Vec::new(),
            thaw: ids(&["c1"]),
            paused: false,
        }
    );
}

#[test]
fn an_idle_sandbox_that_still_provisions_an_engine_is_not_frozen_until_it_is_kept() {
    let observed = [container("c1", "postgres", "p1", false)];
    let p = plan(
        Wanted::Yes,
        true,
        vec![
            keep("postgres", "p1"),
            Action::Provision(Provision {
                engine: engine("redis"),
                features: Default::default(),
                reuse: None,
                host_port: None,
                replace: Vec::new(),
                retire: None,
                reason: ProvisionReason::Heal,
                seed: None,
            }),
        ],
    );
    assert_eq!(step(&p, &observed), Step::default());
}

#[test]
fn a_frozen_container_about_to_be_torn_down_is_thawed_first_and_nothing_is_frozen() {
    let observed = [
        container("c1", "postgres", "p1", true),
        container("c2", "redis", "r1", false),
    ];
    let teardown = |id: &str, engine: &str| {
        Action::Teardown(Teardown {
            container: ContainerId::new(id),
            engine: engine.into(),
            reason: ReapReason::Deleted,
        })
    };
    let p = plan(
        Wanted::Deleted,
        false,
        vec![teardown("c1", "postgres"), teardown("c2", "redis")],
    );
    assert_eq!(
        step(&p, &observed),
        Step {
            freeze: Vec::new(),
            thaw: ids(&["c1"]),
            paused: false,
        }
    );
}

#[test]
fn a_kept_engine_whose_published_container_is_not_listed_blocks_the_pause() {
    let observed = [container("c1", "postgres", "other", false)];
    let p = plan(Wanted::Yes, true, vec![keep("postgres", "p1")]);
    assert_eq!(step(&p, &observed), Step::default());
}
