//! `sandbox_events` on a real Postgres and Docker: what sandboxd records
//! of a heal and how `sandboxd describe` shows it, that no event holds a
//! credential, that a sandbox's events stay bounded after three times as many heals,
//! that only the leader writes them, and what an orchestrator may read; that
//! the next holder of a released id never prunes the last one's events,
//! while one owner's churn through an id stays bounded (issue 50).

use crate::common;

use common::{docker_ok, eventually, hold_lease, request, sandbox_id, seed_status, TestEnv, BIN};
use sandboxd::client::Client;
use sandboxd::domain::container::ContainerState;
use sandboxd::domain::crash_loop::CrashLoopPolicy;
use sandboxd::domain::event::{Event, EventReason};
use sandboxd::domain::lease::Term;
use sandboxd::domain::{Incarnation, SandboxId, ServiceStatus};
use sandboxd::ports::store::{EventBatch, Store, StoreError};
use std::process::Command;
use std::time::Duration;

/// Every password the sandbox's status holds, and whether any event of the
/// sandbox contains one.
async fn events_hold_a_password(env: &TestEnv, passwords: &[String]) -> Vec<String> {
    let messages: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws(' ', reason, engine, detail, message) FROM sandbox_events",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    messages
        .into_iter()
        .filter(|m| passwords.iter().any(|p| m.contains(p.as_str())))
        .collect()
}

/// Waits until the newest event of `id` is its `heal`th heal.
async fn heal_recorded(client: &Client, id: &SandboxId, heal: u32) {
    let said = format!("(heal {heal})");
    eventually(
        &format!("the event of heal {heal}"),
        Duration::from_secs(30),
        || async {
            let events = client.events(id, 1).await.unwrap();
            events
                .last()
                .filter(|e| e.reason == "healed" && e.message.contains(&said))
                .map(|_| ())
        },
    )
    .await;
}

fn passwords(services: &[&ServiceStatus]) -> Vec<String> {
    services
        .iter()
        .map(|s| s.password.expose().to_owned())
        .collect()
}

// Multi-threaded: the controller runs in this process while the test
// blocks on the binary.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_docker_kill_describe_lists_the_heal_with_its_cause_and_no_event_holds_a_password()
{
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("heal");
    let ready = client
        .provision(
            &id,
            &request(&["postgres", "redis"], &[]),
            Duration::from_secs(90),
        )
        .await
        .expect("ready");
    let redis = ready.services["redis"].clone();
    let container = env
        .containers(Some(&id))
        .await
        .into_iter()
        .find(|c| c.labels.engine == "redis")
        .expect("a redis container");
    docker_ok(&["kill", container.id.as_str()]);
    eventually("the heal", Duration::from_secs(60), || async {
        let s = client.status(&id).await.unwrap()?;
        (s.phase == sandboxd::domain::Phase::Ready && s.services["redis"].heals == 1).then_some(())
    })
    .await;
    // The reconcile records its events once it has published the status.
    heal_recorded(&client, &id, 1).await;

    let out = Command::new(BIN)
        .args(["describe", id.as_str()])
        .env("DATABASE_URL", &env.url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let heal = text
        .lines()
        .find(|l| l.contains("healed [stopped]"))
        .unwrap_or_else(|| panic!("no heal in:\n{text}"));
    assert!(
        heal.contains("redis") && heal.contains("killed or stopped from outside"),
        "{heal}"
    );
    assert!(text.contains("provisioned"), "{text}");
    assert!(text.contains("Heals:        1"), "{text}");
    assert!(text.contains("Image:        sandboxd/redis"), "{text}");
    assert!(
        text.contains("Password:     *** (--show-secrets)"),
        "{text}"
    );
    let all = passwords(&[&ready.services["postgres"], &redis]);
    for p in &all {
        assert!(
            !text.contains(p.as_str()),
            "describe shows a password:\n{text}"
        );
    }
    assert_eq!(
        events_hold_a_password(&env, &all).await,
        Vec::<String>::new()
    );

    let out = Command::new(BIN)
        .args([
            "describe",
            id.as_str(),
            "--show-secrets",
            "--output",
            "json",
        ])
        .env("DATABASE_URL", &env.url)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        json["status"]["services"]["redis"]["password"],
        redis.password.expose()
    );
    let reasons: Vec<&str> = json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"healed"), "{reasons:?}");
    controller.stop().await;
}

#[tokio::test]
async fn a_sandboxs_events_stay_under_the_bound_after_three_times_as_many_heals() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // Every death healed at once: this test is about the events, not the
    // crash-loop back-off.
    config.crash_loop = CrashLoopPolicy {
        base: Duration::ZERO,
        cap: Duration::ZERO,
        window: Duration::from_millis(1),
    };
    // A small bound, passed three times over: the bound is enforced the
    // same whatever its size, and thirty heals take a third of what a
    // hundred did.
    config.events_per_sandbox = 10;
    let keep = config.events_per_sandbox;
    let heals = keep * 3;
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("bounded");
    let ready = client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(60))
        .await
        .expect("ready");
    for heal in 1..=heals {
        let container = eventually("the redis container", Duration::from_secs(30), || async {
            env.containers(Some(&id))
                .await
                .into_iter()
                .find(|c| c.state == ContainerState::Running)
        })
        .await;
        docker_ok(&["kill", container.id.as_str()]);
        eventually(&format!("heal {heal}"), Duration::from_secs(60), || async {
            let s = client.status(&id).await.unwrap()?;
            (s.phase == sandboxd::domain::Phase::Ready && s.services["redis"].heals == heal)
                .then_some(())
        })
        .await;
    }
    heal_recorded(&client, &id, heals).await;
    let (rows, counted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(count), 0) FROM sandbox_events WHERE sandbox_id = $1",
    )
    .bind(id.as_str())
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(
        rows <= i64::from(keep),
        "{rows} events kept, the bound is {keep}"
    );
    assert!(
        counted >= i64::from(keep),
        "the newest {keep} are kept: {counted}"
    );
    let events = client.events(&id, 1000).await.unwrap();
    let last = events.last().expect("events");
    assert_eq!(last.reason, "healed");
    assert!(
        last.message.contains(&format!("(heal {heals})")),
        "{}",
        last.message
    );
    assert_eq!(
        events_hold_a_password(&env, &passwords(&[&ready.services["redis"]])).await,
        Vec::<String>::new()
    );
    controller.stop().await;
}

fn batch<'a>(
    sandbox: &'a SandboxId,
    owner: &'a str,
    events: &'a [Event],
    keep: u32,
) -> EventBatch<'a> {
    EventBatch {
        sandbox,
        owner,
        incarnation: None,
        events,
        keep,
    }
}

fn event(reason: EventReason, message: &str) -> Event {
    Event {
        reason,
        engine: Some("postgres".into()),
        detail: None,
        message: message.into(),
    }
}

#[tokio::test]
async fn events_are_written_by_the_leader_only_counted_when_repeated_scrubbed_and_pruned_by_age() {
    let env = TestEnv::new().await;
    let store =
        sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let id = sandbox_id("store");
    let term = Term(hold_lease(&env.pool).await);
    // A status whose password a careless message repeats.
    seed_status(
        &env.pool,
        id.as_str(),
        r#"{"postgres": {"password": "pw-in-status-0123456789"}}"#,
        term.0,
    )
    .await;
    let repeated = vec![
        event(
            EventReason::Failed,
            "login with pw-in-status-0123456789 failed",
        ),
        event(
            EventReason::Failed,
            "login with pw-in-status-0123456789 failed",
        ),
    ];
    store
        .record_events(batch(&id, "orch-a", &repeated, 3), term)
        .await
        .unwrap();
    store
        .record_events(batch(&id, "orch-a", &repeated, 3), term)
        .await
        .unwrap();
    let events = store.events(&id, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].count, 4);
    assert_eq!(events[0].message, "login with *** failed");

    // A deposed leader's events never land.
    let err = store
        .record_events(batch(&id, "orch-a", &repeated, 3), Term(term.0 + 1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");

    let many: Vec<Event> = (1..=5)
        .map(|i| event(EventReason::Healed, &format!("heal {i}")))
        .collect();
    store
        .record_events(batch(&id, "orch-a", &many, 3), term)
        .await
        .unwrap();
    let kept: Vec<String> = store
        .events(&id, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_eq!(
        kept,
        ["heal 3", "heal 4", "heal 5"],
        "the newest three, oldest first"
    );

    sqlx::query(
        "UPDATE sandbox_events SET last_at = now() - interval '2 days' WHERE message = 'heal 3'",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        store
            .prune_events(Duration::from_secs(86_400))
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.events(&id, 10).await.unwrap().len(), 2);
}

#[tokio::test]
async fn an_orchestrator_reads_the_events_of_the_rows_it_may_read_and_writes_none() {
    let env = TestEnv::new().await;
    let store =
        sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let term = Term(hold_lease(&env.pool).await);
    let suffix = env.deployment.as_str().to_owned();
    let (mine, theirs) = (format!("orch-{suffix}"), format!("other-{suffix}"));
    let (pool, _) = env.create_login_role(&mine).await;
    store.grant_orchestrator(&mine, true).await.unwrap();
    let (a, b) = (sandbox_id("mine"), sandbox_id("theirs"));
    let one = [event(EventReason::Provisioned, "created")];
    for (id, owner) in [(&a, mine.as_str()), (&b, theirs.as_str())] {
        store
            .record_events(batch(id, owner, &one, 50), term)
            .await
            .unwrap();
    }
    let seen: Vec<String> = sqlx::query_scalar("SELECT sandbox_id FROM sandbox_events")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(seen, [a.to_string()], "only its own rows' events");
    let orchestrator = Client::from_pool(pool.clone());
    assert_eq!(orchestrator.events(&a, 10).await.unwrap().len(), 1);
    assert!(orchestrator.events(&b, 10).await.unwrap().is_empty());
    for write in [
        "INSERT INTO sandbox_events (sandbox_id, reason, message, leader_term) VALUES ('x', 'healed', 'forged', 1)",
        "DELETE FROM sandbox_events",
        "SELECT sandbox_record_events(1, 'x', NULL, '', '[]', 1)",
    ] {
        let err = sqlx::query(write).execute(&pool).await.unwrap_err();
        assert!(err.to_string().contains("permission denied"), "{write}: {err}");
    }
    // Revoked: nothing.
    store.revoke_orchestrator(&mine).await.unwrap();
    let err = sqlx::query("SELECT 1 FROM sandbox_events")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
}

/// The events of `id` that `pool`'s role may read, oldest first, as
/// `(reason, incarnation)`.
async fn seen_events(pool: &sqlx::PgPool, id: &SandboxId) -> Vec<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT reason, incarnation::text FROM sandbox_events WHERE sandbox_id = $1 ORDER BY seq",
    )
    .bind(id.as_str())
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Only the newest N events of an id were kept, whoever owned them: the
/// tenant that took a released id next pruned the last tenant's events
/// (issue 50, finding 8). As the attacker did it, through the controller:
/// tenant A holds an id twice over, releases it, tenant B takes it; with
/// one event kept, B's first one took A's last.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_that_takes_a_released_id_leaves_the_last_tenants_events_alone() {
    let env = TestEnv::new().await;
    let (_, a) = env.own_rows_orchestrator("handed_a").await;
    let (_, b) = env.own_rows_orchestrator("handed_b").await;
    let mut config = env.config();
    config.events_per_sandbox = 1;
    let controller = env.start(config);
    let (client_a, client_b) = (Client::from_pool(a.clone()), Client::from_pool(b.clone()));
    let id = sandbox_id("handed");
    let mut req = request(&["redis"], &[]);
    req.owner = String::new(); // the requesting role
    const READY: Duration = Duration::from_secs(60);
    for round in 1..=2 {
        client_a.provision(&id, &req, READY).await.unwrap();
        let incarnation = client_a.incarnation(&id).await.unwrap().expect("A's row");
        assert!(client_a.release(&id).await.unwrap());
        let reaped = ("reaped".to_owned(), Some(incarnation.as_str().to_owned()));
        eventually(
            &format!("A's round {round} torn down"),
            Duration::from_secs(30),
            || async { (seen_events(&a, &id).await == [reaped.clone()]).then_some(()) },
        )
        .await;
    }
    let a_kept = seen_events(&a, &id).await;

    client_b.provision(&id, &req, READY).await.unwrap();
    eventually("B's event", Duration::from_secs(30), || async {
        let seen = seen_events(&b, &id).await;
        (seen.len() == 1 && seen[0].0 == "provisioned").then_some(())
    })
    .await;
    assert_eq!(seen_events(&a, &id).await, a_kept, "B's events pruned A's");
    client_b.release(&id).await.unwrap();
    controller.stop().await;
}

/// What bounds the events of old incarnations, now that another owner's
/// never prune them: an id keeps its newest N events per owner. An owner
/// releasing and requesting an id again and again keeps N of it, however
/// many incarnations it went through; the next owner keeps N of its own.
#[tokio::test]
async fn one_owner_churning_through_an_id_keeps_the_bound_and_never_prunes_another_owners_events() {
    let env = TestEnv::new().await;
    let store =
        sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let term = Term(hold_lease(&env.pool).await);
    let (role_a, a) = env.own_rows_orchestrator("churn_a").await;
    let (role_b, b) = env.own_rows_orchestrator("churn_b").await;
    let id = sandbox_id("churn");
    let keep = 3;
    let write = |owner: &str, round: u32| {
        let (store, id, owner) = (&store, &id, owner.to_owned());
        async move {
            let incarnation =
                Incarnation::parse(&format!("00000000-0000-4000-8000-{round:012}")).unwrap();
            let events: Vec<Event> = (1..=4)
                .map(|i| event(EventReason::Healed, &format!("{owner} {round}.{i}")))
                .collect();
            store
                .record_events(
                    EventBatch {
                        sandbox: id,
                        owner: &owner,
                        incarnation: Some(&incarnation),
                        events: &events,
                        keep,
                    },
                    term,
                )
                .await
                .unwrap();
        }
    };
    let messages = |pool: sqlx::PgPool| {
        let id = id.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT message FROM sandbox_events WHERE sandbox_id = $1 ORDER BY seq",
            )
            .bind(id.as_str())
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    // B held the id once; A took it then, releasing and requesting it
    // again 200 times.
    write(&role_b, 0).await;
    for round in 1..=200 {
        write(&role_a, round).await;
    }
    assert_eq!(
        messages(b.clone()).await,
        [2, 3, 4].map(|i| format!("{role_b} 0.{i}")),
        "A's churn pruned B's events"
    );
    assert_eq!(
        messages(a.clone()).await,
        [2, 3, 4].map(|i| format!("{role_a} 200.{i}")),
        "A keeps its newest {keep}"
    );
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM sandbox_events WHERE sandbox_id = $1")
        .bind(id.as_str())
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(all, 2 * i64::from(keep), "the id's events are bounded");
}
