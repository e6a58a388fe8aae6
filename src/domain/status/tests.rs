//! The decision table of the status decision, one row per situation.

use super::*;
use crate::domain::crash_loop::HealGate;
use crate::domain::id::{ContainerId, SandboxId};
use crate::domain::identity::Incarnation;
use crate::domain::plan::{Action, Provision, ProvisionReason, ReapReason, Teardown};
use crate::domain::secret::Secret;
use chrono::{DateTime, TimeZone, Utc};

/// The incarnation of the table's rows.
const ROW: &str = "0a0b0c0d-0000-4000-8000-000000000002";
/// An earlier incarnation of the same id.
const EARLIER: &str = "0a0b0c0d-0000-4000-8000-000000000001";

fn incarnation(text: &str) -> Incarnation {
    Incarnation::parse(text).unwrap()
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
}

fn engine(name: &'static str) -> EngineName {
    EngineName::of_engine(name)
}

fn service(instance: &str) -> ServiceStatus {
    ServiceStatus {
        host: "h".into(),
        port: 1,
        host_port: 2,
        user: "u".into(),
        password: Secret::new(format!("pw-{instance}")),
        database: "db".into(),
        url: "x://h".into(),
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

/// A live row at `generation` wanting `services`.
fn row(generation: i64, services: &[&'static str]) -> DesiredSandbox {
    DesiredSandbox {
        id: SandboxId::parse("sb-1").unwrap(),
        owner: "ci".into(),
        services: services.iter().map(|s| engine(s)).collect(),
        unknown_services: Vec::new(),
        attach: Vec::new(),
        invalid: None,
        features: BTreeMap::new(),
        expires_at: None,
        generation,
        incarnation: Some(incarnation(ROW)),
        updated_at: now(),
        created_at: now(),
        last_used_at: now(),
        idle_timeout: None,
        persistent: false,
        idle_action: Default::default(),
        owner_container: None,
        isolation: None,
        seeds: Default::default(),
        fork_of: None,
    }
}

/// A published status at `generation` with `(engine, instance)` entries.
fn published(generation: i64, entries: &[(&str, &str)]) -> SandboxStatus {
    SandboxStatus {
        id: SandboxId::parse("sb-1").unwrap(),
        phase: Phase::Ready,
        observed_generation: generation,
        message: String::new(),
        services: entries
            .iter()
            .map(|(e, i)| ((*e).to_owned(), Box::new(service(i))))
            .collect(),
        updated_at: Some(now()),
        network: None,
        incarnation: Some(incarnation(ROW)),
    }
}

fn keep(name: &'static str, instance: &str) -> Action {
    Action::Keep {
        engine: engine(name),
        status: service(instance),
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

fn teardown(id: &str) -> Action {
    Action::Teardown(Teardown {
        container: ContainerId::new(id),
        engine: "redis".into(),
        reason: ReapReason::Deleted,
    })
}

fn wait(id: &str) -> Action {
    Action::Wait {
        container: ContainerId::new(id),
        until: now() + chrono::Duration::seconds(60),
    }
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

fn ok(name: &'static str, instance: &str) -> (EngineName, Result<ServiceStatus, String>) {
    (engine(name), Ok(service(instance)))
}

fn failed(name: &'static str, why: &str) -> (EngineName, Result<ServiceStatus, String>) {
    (engine(name), Err(why.into()))
}

/// `write ready gen=2 services=[postgres:p1] msg=""` / `delete` / `nothing`,
/// then `; retry teardown: …` or `; retry provision: …` when it fails.
fn summary(v: &Verdict) -> String {
    let publish = match &v.publish {
        Publish::Write(u) => {
            let services: Vec<String> = u
                .services
                .iter()
                .map(|(e, s)| format!("{e}:{}", s.instance))
                .collect();
            format!(
                "write {} gen={} services=[{}] msg={:?}",
                u.phase,
                u.observed_generation,
                services.join(","),
                u.message
            )
        }
        Publish::Delete => "delete".into(),
        Publish::Nothing => "nothing".into(),
    };
    match &v.failure {
        None => publish,
        Some(Failure::Teardown(e)) => format!("{publish}; retry teardown: {e}"),
        Some(Failure::Provision(e)) => format!("{publish}; retry provision: {e}"),
    }
}

type Row = (
    &'static str,
    Plan,
    Option<DesiredSandbox>,
    Option<SandboxStatus>,
    Outcomes,
    &'static str,
);

fn outcomes(
    provisioned: Vec<(EngineName, Result<ServiceStatus, String>)>,
    teardown: Option<&str>,
) -> Outcomes {
    Outcomes {
        provisioned,
        teardown: teardown.map(String::from),
        attach: Vec::new(),
        held: Vec::new(),
        heal_failures: BTreeMap::new(),
        awaiting: Vec::new(),
        paused: None,
    }
}

/// Like [`outcomes`], with redis waiting for its image.
fn waiting_for_an_image(
    provisioned: Vec<(EngineName, Result<ServiceStatus, String>)>,
    teardown: Option<&str>,
) -> Outcomes {
    Outcomes {
        awaiting: vec!["redis: waiting for image r:1 (pulling)".into()],
        ..outcomes(provisioned, teardown)
    }
}

fn table() -> Vec<Row> {
    let unknown = {
        let mut d = row(3, &["postgres"]);
        d.unknown_services = vec!["nonesuch".into()];
        d
    };
    let invalid = {
        let mut d = row(3, &[]);
        d.invalid = Some("services is not a one-dimensional list".into());
        d
    };
    vec![
        // --- wanted ---------------------------------------------------------
        (
            "a fresh sandbox is ready at the row's generation once provisioned",
            plan(Wanted::Yes, vec![provision("postgres")]),
            Some(row(1, &["postgres"])),
            None,
            outcomes(vec![ok("postgres", "p1")], None),
            r#"write ready gen=1 services=[postgres:p1] msg="""#,
        ),
        (
            "a kept engine republishes its status with the new generation",
            plan(Wanted::Yes, vec![keep("postgres", "p1")]),
            Some(row(2, &["postgres"])),
            Some(published(1, &[("postgres", "p1")])),
            outcomes(vec![], None),
            r#"write ready gen=2 services=[postgres:p1] msg="""#,
        ),
        (
            "a dropped service disappears from the status",
            plan(Wanted::Yes, vec![keep("postgres", "p1"), teardown("c2")]),
            Some(row(2, &["postgres"])),
            Some(published(1, &[("postgres", "p1"), ("redis", "r1")])),
            outcomes(vec![], None),
            r#"write ready gen=2 services=[postgres:p1] msg="""#,
        ),
        (
            "a failed engine fails the sandbox and keeps what others published",
            plan(Wanted::Yes, vec![keep("postgres", "p1"), provision("redis")]),
            Some(row(2, &["postgres", "redis"])),
            Some(published(1, &[("postgres", "p1")])),
            outcomes(vec![failed("redis", "image missing")], None),
            "write failed gen=2 services=[postgres:p1] msg=\"redis: image missing\"; retry provision: redis: image missing",
        ),
        (
            "a failed heal keeps publishing the credentials being healed",
            plan(Wanted::Yes, vec![provision("postgres")]),
            Some(row(1, &["postgres"])),
            Some(published(1, &[("postgres", "p1")])),
            outcomes(vec![failed("postgres", "not ready")], None),
            "write failed gen=1 services=[postgres:p1] msg=\"postgres: not ready\"; retry provision: postgres: not ready",
        ),
        (
            "every failed engine is named on its own line",
            plan(Wanted::Yes, vec![provision("postgres"), provision("redis")]),
            Some(row(1, &["postgres", "redis"])),
            None,
            outcomes(vec![failed("postgres", "a"), failed("redis", "b")], None),
            "write failed gen=1 services=[] msg=\"postgres: a\\nredis: b\"; retry provision: postgres: a\nredis: b",
        ),
        (
            "a failed teardown of a ready sandbox is reported and retried",
            plan(Wanted::Yes, vec![keep("postgres", "p1"), teardown("c2")]),
            Some(row(1, &["postgres"])),
            Some(published(1, &[("postgres", "p1")])),
            outcomes(vec![], Some("docker remove failed")),
            "write ready gen=1 services=[postgres:p1] msg=\"ready; cleanup pending: docker remove failed\"; retry teardown: docker remove failed",
        ),
        (
            "a provision failure wins over a teardown failure",
            plan(Wanted::Yes, vec![provision("postgres"), teardown("c2")]),
            Some(row(1, &["postgres"])),
            None,
            outcomes(vec![failed("postgres", "x")], Some("y")),
            "write failed gen=1 services=[] msg=\"postgres: x\"; retry provision: postgres: x",
        ),
        (
            "a row naming an unknown engine fails with a message saying what to do",
            plan(Wanted::Yes, vec![provision("postgres")]),
            Some(unknown),
            None,
            outcomes(vec![ok("postgres", "p1")], None),
            "write failed gen=3 services=[postgres:p1] msg=\"nonesuch: unknown engine; this sandboxd does not run it (table sandbox_engines lists those it does): remove it from services or upgrade sandboxd\"; retry provision: nonesuch: unknown engine; this sandboxd does not run it (table sandbox_engines lists those it does): remove it from services or upgrade sandboxd",
        ),
        (
            "an invalid row fails with the reason and keeps publishing its kept containers",
            plan(Wanted::Yes, vec![]),
            Some(invalid),
            Some(published(2, &[("redis", "r1")])),
            outcomes(vec![], None),
            "write failed gen=3 services=[redis:r1] msg=\"the desired row is invalid: services is not a one-dimensional list; rewrite it (the database's checks say what is allowed)\"; retry provision: the desired row is invalid: services is not a one-dimensional list; rewrite it (the database's checks say what is allowed)",
        ),
        (
            "an engine waiting for its image is provisioning at the previous generation, without a retry",
            plan(Wanted::Yes, vec![keep("postgres", "p1")]),
            Some(row(2, &["postgres", "redis"])),
            Some(published(1, &[("postgres", "p1")])),
            waiting_for_an_image(vec![], None),
            r#"write provisioning gen=1 services=[postgres:p1] msg="redis: waiting for image r:1 (pulling)""#,
        ),
        (
            "a rotation waiting for its image keeps publishing the old credentials",
            plan(Wanted::Yes, vec![]),
            Some(row(2, &["redis"])),
            Some(published(1, &[("redis", "r1")])),
            waiting_for_an_image(vec![], None),
            r#"write provisioning gen=1 services=[redis:r1] msg="redis: waiting for image r:1 (pulling)""#,
        ),
        (
            "a failed engine wins over one waiting for its image, and both are named",
            plan(Wanted::Yes, vec![provision("postgres")]),
            Some(row(2, &["postgres", "redis"])),
            None,
            waiting_for_an_image(vec![failed("postgres", "x")], None),
            "write failed gen=2 services=[] msg=\"postgres: x\\nredis: waiting for image r:1 (pulling)\"; retry provision: postgres: x\nredis: waiting for image r:1 (pulling)",
        ),
        (
            "a failed teardown while waiting for an image is retried",
            plan(Wanted::Yes, vec![teardown("c2")]),
            Some(row(2, &["redis"])),
            None,
            waiting_for_an_image(vec![], Some("busy")),
            r#"write provisioning gen=0 services=[] msg="redis: waiting for image r:1 (pulling)"; retry teardown: busy"#,
        ),
        // --- deleted ---------------------------------------------------------
        (
            "a deleted sandbox with nothing left loses its status row",
            plan(Wanted::Deleted, vec![teardown("c1")]),
            None,
            Some(published(4, &[("postgres", "p1")])),
            outcomes(vec![], None),
            "delete",
        ),
        (
            "a deleted sandbox waiting for its grace window is terminating at its last generation",
            plan(Wanted::Deleted, vec![wait("c1")]),
            None,
            Some(published(4, &[("postgres", "p1")])),
            outcomes(vec![], None),
            r#"write terminating gen=4 services=[] msg="deleted: waiting for the grace window before removing containers""#,
        ),
        (
            "an orphan waiting for its grace window gets no status row",
            plan(Wanted::Deleted, vec![wait("c1")]),
            None,
            None,
            outcomes(vec![], None),
            "nothing",
        ),
        (
            "a failed teardown of a deleted sandbox leaves the status and retries",
            plan(Wanted::Deleted, vec![teardown("c1")]),
            None,
            Some(published(4, &[("postgres", "p1")])),
            outcomes(vec![], Some("busy")),
            "nothing; retry teardown: busy",
        ),
        // --- expired ---------------------------------------------------------
        (
            "an expired row stays terminating at its own generation",
            plan(Wanted::Expired, vec![teardown("c1")]),
            Some(row(5, &["postgres"])),
            Some(published(4, &[("postgres", "p1")])),
            outcomes(vec![], None),
            r#"write terminating gen=5 services=[] msg="expired: the row is past expires_at""#,
        ),
        (
            "an expired row waiting for its grace window is terminating too",
            plan(Wanted::Expired, vec![wait("c1")]),
            Some(row(5, &["postgres"])),
            None,
            outcomes(vec![], None),
            r#"write terminating gen=5 services=[] msg="expired: the row is past expires_at""#,
        ),
    ]
}

#[test]
fn the_status_decision_table_holds() {
    let mut failures = Vec::new();
    for (name, plan, desired, previous, outcomes, want) in table() {
        let got = summary(&decide(
            &plan,
            desired.as_ref(),
            previous.as_ref(),
            &outcomes,
        ));
        if got != want {
            failures.push(format!("{name}:\n  want {want}\n  got  {got}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn status_decision_table_names_are_unique() {
    let names: std::collections::BTreeSet<&str> = table().iter().map(|r| r.0).collect();
    assert_eq!(names.len(), table().len());
}

#[test]
fn provisioning_is_announced_at_the_previous_generation_with_the_engines_named() {
    let p = plan(
        Wanted::Yes,
        vec![
            keep("postgres", "p2"),
            provision("redis"),
            provision("mongo"),
        ],
    );
    let d = row(3, &["postgres", "redis", "mongo"]);
    let prev = published(2, &[("postgres", "p1"), ("redis", "r1")]);
    let update =
        while_provisioning(&p, Some(&d), Some(&prev), &BTreeMap::new()).expect("an update");
    assert_eq!(update.phase, Phase::Provisioning);
    assert_eq!(update.observed_generation, 2);
    assert_eq!(update.message, "provisioning redis, mongo");
    let instances: Vec<(&str, &str)> = update
        .services
        .iter()
        .map(|(e, s)| (e.as_str(), s.instance.as_str()))
        .collect();
    // The kept status wins; the engine being re-provisioned keeps its old one.
    assert_eq!(instances, [("postgres", "p2"), ("redis", "r1")]);
}

fn rotation(name: &'static str, old: &str) -> Action {
    match provision(name) {
        Action::Provision(p) => Action::Provision(Provision {
            reason: ProvisionReason::Rotate,
            retire: Some(ContainerId::new(old)),
            ..p
        }),
        _ => unreachable!(),
    }
}

#[test]
fn a_rotation_is_announced_with_the_old_credentials_still_published() {
    let p = plan(
        Wanted::Yes,
        vec![rotation("postgres", "c1"), provision("redis")],
    );
    let d = row(3, &["postgres", "redis"]);
    let prev = published(2, &[("postgres", "p1")]);
    let update =
        while_provisioning(&p, Some(&d), Some(&prev), &BTreeMap::new()).expect("an update");
    assert_eq!(update.phase, Phase::Provisioning);
    assert_eq!(update.observed_generation, 2);
    assert_eq!(
        update.message,
        "provisioning redis; rotating postgres: a new container is built next to the running one, \
         which serves the published credentials until the new one is ready"
    );
    assert_eq!(update.services["postgres"].instance, "p1");
}

#[test]
fn switching_publishes_the_new_container_and_keeps_the_rest_of_the_status() {
    let p = plan(
        Wanted::Yes,
        vec![keep("redis", "r1"), rotation("postgres", "c1")],
    );
    let d = row(3, &["postgres", "redis"]);
    let prev = published(2, &[("postgres", "p1"), ("redis", "r1")]);
    let update =
        while_provisioning(&p, Some(&d), Some(&prev), &BTreeMap::new()).expect("an update");
    let switched = switching(
        update.clone(),
        engine("postgres"),
        service("p2"),
        "the new container is ready; switching to it",
    );
    assert_eq!(
        switched.phase,
        Phase::Provisioning,
        "not ready before the switch"
    );
    assert_eq!(
        switched.observed_generation, 2,
        "the new generation is not observed yet"
    );
    assert_eq!(switched.services["postgres"].instance, "p2");
    assert_eq!(switched.services["redis"].instance, "r1");
    assert!(
        switched
            .message
            .ends_with("postgres: the new container is ready; switching to it"),
        "{}",
        switched.message
    );
    assert!(switched.message.starts_with(&update.message));
}

#[test]
fn a_failed_rotation_keeps_the_old_credentials_published_and_says_why() {
    let p = plan(Wanted::Yes, vec![rotation("postgres", "c1")]);
    let d = row(3, &["postgres"]);
    let prev = published(2, &[("postgres", "p1")]);
    let o = outcomes(
        vec![(engine("postgres"), Err("did not become ready".into()))],
        None,
    );
    let v = decide(&p, Some(&d), Some(&prev), &o);
    let Publish::Write(update) = &v.publish else {
        panic!("a status is written");
    };
    assert_eq!(update.phase, Phase::Failed);
    assert_eq!(update.observed_generation, 3);
    assert_eq!(update.message, "postgres: did not become ready");
    assert_eq!(update.services["postgres"].instance, "p1");
    assert!(v.failure.is_some(), "retried with backoff");
}

#[test]
fn a_held_heal_is_healing_with_its_credentials_and_never_failed() {
    let p = plan(Wanted::Yes, vec![keep("postgres", "p1")]);
    let d = row(2, &["postgres", "redis"]);
    let prev = published(2, &[("postgres", "p1"), ("redis", "r1")]);
    let mut o = outcomes(Vec::new(), None);
    let at = now() + chrono::Duration::seconds(60);
    for (heals, failure) in [(1, None), (40, Some("exited before it became ready"))] {
        o.held = vec![(engine("redis"), HealGate::At { at, heals })];
        o.heal_failures = failure
            .map(|f| (engine("redis"), f.to_owned()))
            .into_iter()
            .collect();
        let v = decide(&p, Some(&d), Some(&prev), &o);
        let Publish::Write(update) = &v.publish else {
            panic!("a status is written");
        };
        assert_eq!(update.phase, Phase::Healing, "{heals} heals");
        let m = &update.message;
        assert!(
            m.starts_with("healing redis: crash loop") && m.contains(&format!("{heals} time(s)")),
            "{m}"
        );
        assert!(
            m.contains(&at.format("%H:%M:%S UTC").to_string()),
            "says when: {m}"
        );
        if let Some(f) = failure {
            assert!(m.contains(f), "says what failed: {m}");
        }
        assert_eq!(
            update.services["redis"].instance, "r1",
            "credentials stay published"
        );
        assert_eq!(v.failure, None, "the back-off, not a retry, says when");
    }
}

#[test]
fn a_heal_is_announced_as_healing_naming_the_engine_and_the_cause() {
    let heal = Action::Provision(Provision {
        reuse: Some(service("r1")),
        reason: ProvisionReason::Heal,
        ..match provision("redis") {
            Action::Provision(p) => p,
            _ => unreachable!(),
        }
    });
    let p = plan(Wanted::Yes, vec![keep("postgres", "p1"), heal]);
    let d = row(2, &["postgres", "redis"]);
    let prev = published(2, &[("postgres", "p1"), ("redis", "r1")]);
    let causes = BTreeMap::from([(engine("redis"), HealCause::Oom)]);
    let update = while_provisioning(&p, Some(&d), Some(&prev), &causes).expect("an update");
    assert_eq!(update.phase, Phase::Healing);
    assert_eq!(
        update.message,
        "healing redis (its container was killed for lack of memory): re-creating with the same credentials; its data is lost"
    );
    assert_eq!(update.observed_generation, 2);
    // The credentials being healed stay published.
    assert_eq!(update.services["redis"].instance, "r1");

    // Healing again after a heal that failed: the reason stays in sight.
    let failures = BTreeMap::from([(engine("redis"), "did not become ready".to_owned())]);
    let again = with_last_failures(update.clone(), &failures);
    assert_eq!(
        again.message,
        format!(
            "{}; redis's last heal failed: did not become ready",
            update.message
        )
    );
    // Only a healing status says it; without a failure nothing changes.
    let provisioning = StatusUpdate {
        phase: Phase::Provisioning,
        ..update.clone()
    };
    assert_eq!(
        with_last_failures(provisioning.clone(), &failures),
        provisioning
    );
    assert_eq!(with_last_failures(update.clone(), &BTreeMap::new()), update);
}

#[test]
fn nothing_is_announced_when_nothing_is_provisioned_or_the_row_is_gone() {
    let d = row(1, &["postgres"]);
    let kept = plan(Wanted::Yes, vec![keep("postgres", "p1")]);
    assert_eq!(
        while_provisioning(&kept, Some(&d), None, &BTreeMap::new()),
        None
    );
    let gone = plan(Wanted::Deleted, vec![teardown("c1")]);
    assert_eq!(
        while_provisioning(&gone, None, None, &BTreeMap::new()),
        None
    );
    let expired = plan(Wanted::Expired, vec![provision("postgres")]);
    assert_eq!(
        while_provisioning(&expired, Some(&d), None, &BTreeMap::new()),
        None
    );
}

#[test]
fn a_row_is_a_new_request_until_a_status_observes_its_generation() {
    let d = row(2, &["postgres"]);
    assert!(is_new_request(&d, None));
    assert!(is_new_request(&d, Some(&published(1, &[]))));
    assert!(!is_new_request(&d, Some(&published(2, &[]))));
}

// ---------------------------------------------------------------------------
// Incarnations: an earlier incarnation's status never looks current
// ---------------------------------------------------------------------------

/// `status` as published for the earlier incarnation of the id.
fn of_earlier(mut status: SandboxStatus) -> SandboxStatus {
    status.incarnation = Some(incarnation(EARLIER));
    status
}

#[test]
fn the_previous_status_table_holds() {
    let unreadable = {
        let mut d = row(1, &["postgres"]);
        d.incarnation = None;
        d.invalid = Some("incarnation is not a uuid".into());
        d
    };
    let before_incarnations = {
        let mut s = published(4, &[("postgres", "p1")]);
        s.incarnation = None;
        s
    };
    let table: Vec<(&str, Option<DesiredSandbox>, Option<SandboxStatus>, bool)> = vec![
        (
            "the row's own incarnation's status counts",
            Some(row(1, &["postgres"])),
            Some(published(1, &[("postgres", "p1")])),
            true,
        ),
        (
            "an earlier incarnation's status vouches for nothing",
            Some(row(1, &["postgres"])),
            Some(of_earlier(published(7, &[("postgres", "p1")]))),
            false,
        ),
        (
            "a status from before incarnations vouches for nothing of a row",
            Some(row(1, &["postgres"])),
            Some(before_incarnations.clone()),
            false,
        ),
        (
            "a deleted row's status is whatever is left",
            None,
            Some(of_earlier(published(7, &[("postgres", "p1")]))),
            true,
        ),
        (
            "a row whose incarnation cannot be read keeps its status (it keeps everything)",
            Some(unreadable),
            Some(before_incarnations),
            true,
        ),
        (
            "no status is no status",
            Some(row(1, &["postgres"])),
            None,
            false,
        ),
    ];
    for (name, desired, previous, kept) in table {
        assert_eq!(
            of_incarnation(previous.as_ref(), desired.as_ref()).is_some(),
            kept,
            "{name}"
        );
    }
}

#[test]
fn a_re_inserted_row_is_a_new_request_announced_and_published_as_its_own_incarnation() {
    // The earlier incarnation got to generation 7 and is still published;
    // the re-inserted row is at generation 1.
    let d = row(1, &["postgres", "redis"]);
    let old = of_earlier(published(7, &[("postgres", "p1"), ("redis", "r1")]));
    let previous = of_incarnation(Some(&old), Some(&d));
    assert!(previous.is_none());
    assert!(is_new_request(&d, previous));

    let p = plan(Wanted::Yes, vec![provision("postgres"), provision("redis")]);
    let announced =
        while_provisioning(&p, Some(&d), previous, &BTreeMap::new()).expect("an update");
    assert_eq!(announced.incarnation, Some(incarnation(ROW)));
    assert_eq!(
        announced.observed_generation, 0,
        "nothing of this row observed yet"
    );
    assert!(
        announced.services.is_empty(),
        "no credentials of the earlier incarnation stay published"
    );

    let v = decide(
        &p,
        Some(&d),
        previous,
        &outcomes(vec![ok("postgres", "p9"), ok("redis", "r9")], None),
    );
    let Publish::Write(update) = &v.publish else {
        panic!("a status is written");
    };
    assert_eq!(update.phase, Phase::Ready);
    assert_eq!(update.incarnation, Some(incarnation(ROW)));
    assert_eq!(update.observed_generation, 1);
    let instances: Vec<&str> = update
        .services
        .values()
        .map(|s| s.instance.as_str())
        .collect();
    assert_eq!(instances, ["p9", "r9"]);
}

#[test]
fn a_terminating_status_keeps_the_incarnation_it_is_about() {
    // A deleted row: the status left is the row's that was deleted.
    let old = of_earlier(published(3, &[("postgres", "p1")]));
    let v = decide(
        &plan(Wanted::Deleted, vec![wait("c1")]),
        None,
        Some(&old),
        &outcomes(vec![], None),
    );
    let Publish::Write(update) = &v.publish else {
        panic!("a terminating status is written");
    };
    assert_eq!(update.phase, Phase::Terminating);
    assert_eq!(update.incarnation, Some(incarnation(EARLIER)));

    // An expired row: its own.
    let d = row(5, &["postgres"]);
    let v = decide(
        &plan(Wanted::Expired, vec![wait("c1")]),
        Some(&d),
        None,
        &outcomes(vec![], None),
    );
    let Publish::Write(update) = &v.publish else {
        panic!("a terminating status is written");
    };
    assert_eq!(update.incarnation, Some(incarnation(ROW)));
}

#[test]
fn an_idle_sandbox_whose_containers_are_frozen_is_published_paused_with_its_credentials() {
    let mut p = plan(Wanted::Yes, vec![keep("postgres", "p1")]);
    p.pause = true;
    let d = row(2, &["postgres"]);
    let o = Outcomes {
        paused: Some(Ok(())),
        ..Outcomes::default()
    };
    let v = decide(&p, Some(&d), None, &o);
    let Publish::Write(update) = v.publish else {
        panic!("{v:?}");
    };
    assert_eq!(update.phase, Phase::Paused);
    assert_eq!(update.message, PAUSED);
    assert_eq!(update.observed_generation, 2);
    assert_eq!(update.services["postgres"].instance, "p1");
    assert!(v.failure.is_none());
}

#[test]
fn a_pause_that_failed_is_a_failure_retried_with_backoff_and_the_credentials_stay() {
    let p = plan(Wanted::Yes, vec![keep("postgres", "p1")]);
    let d = row(2, &["postgres"]);
    let o = Outcomes {
        paused: Some(Err("docker said no".into())),
        ..Outcomes::default()
    };
    let v = decide(&p, Some(&d), None, &o);
    let Publish::Write(update) = v.publish else {
        panic!("{v:?}");
    };
    assert_eq!(update.phase, Phase::Failed);
    assert!(update
        .message
        .contains("pausing the idle sandbox failed: docker said no"));
    assert_eq!(update.services["postgres"].instance, "p1");
    assert!(matches!(v.failure, Some(Failure::Provision(_))));
}
