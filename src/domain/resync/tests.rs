//! Which sandboxes a relist may leave alone: only what its snapshot shows
//! converged, never a sandbox with anything to do.

use super::*;
use crate::domain::container::ContainerState;
use crate::domain::id::{ContainerId, Deployment, EngineName, SandboxId};
use crate::domain::identity::Incarnation;
use crate::domain::labels::ContainerLabels;
use crate::domain::sandbox::ServiceStatus;
use crate::domain::secret::Secret;
use chrono::TimeZone;
use std::collections::BTreeMap;
use std::time::Duration;

const ROW: &str = "0a0b0c0d-0000-4000-8000-000000000002";
const NET: &str = "sandboxd.test.sb-1";

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
}

fn policy() -> Policy {
    Policy::with_grace(Duration::from_secs(180))
}

fn row() -> DesiredSandbox {
    DesiredSandbox {
        id: SandboxId::parse("sb-1").unwrap(),
        owner: "ci".into(),
        services: vec![EngineName::of_engine("postgres")],
        unknown_services: Vec::new(),
        attach: Vec::new(),
        invalid: None,
        features: BTreeMap::new(),
        expires_at: None,
        generation: 1,
        incarnation: Some(Incarnation::parse(ROW).unwrap()),
        updated_at: now() - chrono::Duration::seconds(60),
        created_at: now() - chrono::Duration::seconds(60),
        last_used_at: now() - chrono::Duration::seconds(60),
        idle_timeout: None,
        persistent: false,
        idle_action: Default::default(),
        owner_container: None,
        isolation: None,
        seeds: Default::default(),
        fork_of: None,
    }
}

/// The running postgres container of credential set `p1`, on the network.
fn container() -> ObservedContainer {
    ObservedContainer {
        id: ContainerId::new("c1"),
        name: "sandboxd.test.sb-1.postgres".into(),
        labels: ContainerLabels {
            deployment: Deployment::parse("test").unwrap(),
            sandbox: SandboxId::parse("sb-1").unwrap(),
            owner: "ci".into(),
            engine: "postgres".into(),
            generation: 1,
            features: Default::default(),
            instance: "p1".into(),
            state_id: Some("5a5a5a5a-0000-4000-8000-000000000001".into()),
            incarnation: Some(ROW.into()),
            isolation: Default::default(),
            seed: None,
        },
        state: ContainerState::Running,
        created: now() - chrono::Duration::seconds(600),
        host_port: Some(55_432),
        networks: vec![NET.into()],
        paused: false,
    }
}

/// The ready status that published `container()`.
fn status() -> SandboxStatus {
    let service = ServiceStatus {
        host: "postgres".into(),
        port: 5432,
        host_port: 55_432,
        user: "u".into(),
        password: Secret::new("pw".to_owned()),
        database: "db".into(),
        url: "postgres://u:pw@postgres/db".into(),
        env: BTreeMap::new(),
        available_extensions: Vec::new(),
        instance: "p1".into(),
        ready_at: Some(now() - chrono::Duration::seconds(590)),
        heals: 0,
        image: String::new(),
        node: None,
        seed: None,
    };
    SandboxStatus {
        id: SandboxId::parse("sb-1").unwrap(),
        phase: Phase::Ready,
        observed_generation: 1,
        message: String::new(),
        services: BTreeMap::from([("postgres".to_owned(), Box::new(service))]),
        network: Some(NET.into()),
        updated_at: Some(now() - chrono::Duration::seconds(590)),
        incarnation: Some(Incarnation::parse(ROW).unwrap()),
    }
}

/// What the relist does with the sandbox.
fn judged(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
    network: Option<&str>,
) -> Judgement {
    judge(
        &Snapshot {
            desired,
            observed,
            status,
            network,
            foreign: false,
        },
        now(),
        &policy(),
    )
}

/// Whether the relist would leave the sandbox alone.
fn left_alone(
    desired: Option<&DesiredSandbox>,
    observed: &[ObservedContainer],
    status: Option<&SandboxStatus>,
    network: Option<&str>,
) -> bool {
    judged(desired, observed, status, network) != Judgement::Reconcile
}

#[test]
fn a_ready_sandbox_whose_container_runs_on_its_network_is_left_alone() {
    assert!(left_alone(
        Some(&row()),
        &[container()],
        Some(&status()),
        Some(NET)
    ));
}

#[test]
fn a_sandbox_whose_network_is_gone_or_whose_engine_is_off_it_is_reconciled() {
    assert!(!left_alone(
        Some(&row()),
        &[container()],
        Some(&status()),
        None
    ));
    let mut off = container();
    off.networks.clear();
    assert!(!left_alone(
        Some(&row()),
        &[off],
        Some(&status()),
        Some(NET)
    ));
    let mut elsewhere = status();
    elsewhere.network = Some("sandboxd.test.other".into());
    assert!(!left_alone(
        Some(&row()),
        &[container()],
        Some(&elsewhere),
        Some(NET)
    ));
}

#[test]
fn a_dead_or_missing_or_extra_container_is_reconciled() {
    let mut dead = container();
    dead.state = ContainerState::Exited;
    assert!(!left_alone(
        Some(&row()),
        &[dead],
        Some(&status()),
        Some(NET)
    ));
    assert!(!left_alone(Some(&row()), &[], Some(&status()), Some(NET)));
    let mut duplicate = container();
    duplicate.id = ContainerId::new("c2");
    duplicate.labels.instance = "p2".into();
    assert!(!left_alone(
        Some(&row()),
        &[container(), duplicate],
        Some(&status()),
        Some(NET)
    ));
}

#[test]
fn a_changed_row_or_a_status_not_ready_is_reconciled() {
    let mut newer = row();
    newer.generation = 2;
    assert!(!left_alone(
        Some(&newer),
        &[container()],
        Some(&status()),
        Some(NET)
    ));
    let mut growing = row();
    growing.features = BTreeMap::from([(
        EngineName::of_engine("postgres"),
        ["pgvector".to_owned()].into(),
    )]);
    assert!(!left_alone(
        Some(&growing),
        &[container()],
        Some(&status()),
        Some(NET)
    ));
    let mut failed = status();
    failed.phase = Phase::Failed;
    assert!(!left_alone(
        Some(&row()),
        &[container()],
        Some(&failed),
        Some(NET)
    ));
    assert!(!left_alone(Some(&row()), &[container()], None, Some(NET)));
}

#[test]
fn a_converged_row_that_expires_is_left_alone_until_then_and_reconciled_once_expired() {
    let at = now() + chrono::Duration::seconds(3600);
    let mut expiring = row();
    expiring.expires_at = Some(at);
    assert_eq!(
        judged(Some(&expiring), &[container()], Some(&status()), Some(NET)),
        Judgement::Converged {
            recheck_at: Some(at)
        }
    );
    expiring.expires_at = Some(now() - chrono::Duration::seconds(1));
    assert_eq!(
        judged(Some(&expiring), &[container()], Some(&status()), Some(NET)),
        Judgement::Reconcile
    );
    assert_eq!(
        judged(Some(&row()), &[container()], Some(&status()), Some(NET)),
        Judgement::Converged { recheck_at: None }
    );
}

#[test]
fn a_deleted_row_or_one_asking_for_attachments_or_an_owner_is_reconciled() {
    assert!(!left_alone(
        None,
        &[container()],
        Some(&status()),
        Some(NET)
    ));
    let mut attaching = row();
    attaching.attach = vec!["agent-1".into()];
    assert!(!left_alone(
        Some(&attaching),
        &[container()],
        Some(&status()),
        Some(NET)
    ));
    let mut owned = row();
    owned.owner_container = Some("agent-1".into());
    assert!(!left_alone(
        Some(&owned),
        &[container()],
        Some(&status()),
        Some(NET)
    ));
}

#[test]
fn a_sandbox_whose_id_another_state_database_also_uses_is_reconciled() {
    let observed = [container()];
    let (desired, status) = (row(), status());
    let snapshot = Snapshot {
        desired: Some(&desired),
        observed: &observed,
        status: Some(&status),
        network: Some(NET),
        foreign: true,
    };
    assert_eq!(judge(&snapshot, now(), &policy()), Judgement::Reconcile);
}

/// The row, idle for longer than its minute and asking to pause.
fn idle_pausing() -> DesiredSandbox {
    let mut d = row();
    d.idle_action = crate::domain::sandbox::IdleAction::Pause;
    d.idle_timeout = Some(std::time::Duration::from_secs(60));
    d.last_used_at = now() - chrono::Duration::seconds(120);
    d
}

fn paused_status() -> SandboxStatus {
    SandboxStatus {
        phase: Phase::Paused,
        message: crate::domain::status::PAUSED.into(),
        ..status()
    }
}

#[test]
fn a_paused_sandbox_whose_containers_are_frozen_is_left_alone() {
    let mut frozen = container();
    frozen.paused = true;
    assert_eq!(
        judged(
            Some(&idle_pausing()),
            &[frozen],
            Some(&paused_status()),
            Some(NET)
        ),
        Judgement::Converged { recheck_at: None }
    );
}

#[test]
fn a_sandbox_to_pause_or_to_resume_or_paused_out_of_band_is_reconciled() {
    let mut frozen = container();
    frozen.paused = true;
    // Idle, not frozen yet.
    assert!(!left_alone(
        Some(&idle_pausing()),
        &[container()],
        Some(&status()),
        Some(NET)
    ));
    // Used again (touched) while frozen.
    let mut touched = idle_pausing();
    touched.last_used_at = now();
    assert!(!left_alone(
        Some(&touched),
        &[frozen.clone()],
        Some(&paused_status()),
        Some(NET)
    ));
    // Frozen by someone else while in use.
    assert!(!left_alone(
        Some(&row()),
        &[frozen],
        Some(&status()),
        Some(NET)
    ));
}
