//! One leader per state database: several `sandboxd run` processes share a
//! database and a deployment, one leads through the lease in Postgres, the
//! others stand by and take over; a deposed leader changes nothing, and the
//! database refuses its late status writes. Real processes, real Docker,
//! real Postgres.

use crate::common;

use chrono::Utc;
use common::{eventually, free_port, http_get, request, sandbox_id, Process, TestEnv, TEST_LEASE};
use sandboxd::adapters::PgStore;
use sandboxd::client::Client;
use sandboxd::domain::lease::{Term, TERM_LABEL};
use sandboxd::domain::status::StatusUpdate;
use sandboxd::domain::{Phase, SandboxId};
use sandboxd::ports::{Store, StoreError};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

/// One replica: its process and its metrics port.
struct Replica {
    name: &'static str,
    port: u16,
    process: Process,
}

fn replica(env: &TestEnv, name: &'static str) -> Replica {
    let port = free_port();
    let process = env.spawn_binary(port, &[("SANDBOXD_HOLDER", name)]);
    Replica {
        name,
        port,
        process,
    }
}

/// `/readyz` of a replica: (status code, body).
async fn readyz(r: &Replica) -> Option<(u16, String)> {
    http_get(r.port, "/readyz").await
}

/// One sample of a replica's `/metrics`.
async fn metric(r: &Replica, name: &str) -> Option<f64> {
    let (_, body) = http_get(r.port, "/metrics").await?;
    common::sample(&body, name)
}

async fn wait_leading(r: &Replica) {
    eventually(
        &format!("{} leads and is ready", r.name),
        Duration::from_secs(60),
        || async { (readyz(r).await?.0 == 200).then_some(()) },
    )
    .await;
}

async fn wait_standby(r: &Replica, leader: &str) {
    eventually(
        &format!("{} stands by for {leader}", r.name),
        Duration::from_secs(30),
        || async {
            let (code, body) = readyz(r).await?;
            (code == 503 && body.contains(&format!("standby: {leader} leads"))).then_some(())
        },
    )
    .await;
}

/// Replicas a, b and c: a leads, b and c stand by.
async fn three_replicas(env: &TestEnv) -> [Replica; 3] {
    let a = replica(env, "a");
    wait_leading(&a).await;
    let (b, c) = (replica(env, "b"), replica(env, "c"));
    wait_standby(&b, "a").await;
    wait_standby(&c, "a").await;
    [a, b, c]
}

/// (holder, term) of the lease row.
async fn lease(env: &TestEnv) -> Option<(String, i64)> {
    sqlx::query_as("SELECT holder, term FROM sandbox_leader")
        .fetch_optional(&env.pool)
        .await
        .unwrap()
}

/// Names of the containers of `id` Docker created since `since` (unix
/// seconds), one entry per `create` event.
fn creates(env: &TestEnv, id: &SandboxId, since: i64) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args([
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &Utc::now().timestamp().saturating_add(1).to_string(),
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--filter",
            &format!("label=io.sandboxd.deployment={}", env.deployment),
            "--filter",
            &format!("label=io.sandboxd.sandbox={id}"),
            "--format",
            "{{.Actor.Attributes.name}}",
        ])
        .output()
        .expect("run docker events");
    assert!(out.status.success(), "docker events failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The status row's leader term.
async fn status_term(env: &TestEnv, id: &SandboxId) -> Option<i64> {
    sqlx::query_scalar("SELECT leader_term FROM sandbox_status WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(&env.pool)
        .await
        .unwrap()
        .flatten()
}

#[tokio::test]
async fn the_database_refuses_status_writes_and_deletes_of_a_term_that_no_longer_leads() {
    let env = TestEnv::new().await;
    let store = PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let minute = Duration::from_secs(60);
    let id = SandboxId::parse("fenced").unwrap();
    let update = |message: &str| StatusUpdate {
        phase: Phase::Provisioning,
        observed_generation: 1,
        message: message.into(),
        services: Default::default(),
        network: None,
        incarnation: None,
    };

    let first = store.acquire_lease("a", minute).await.unwrap().unwrap();
    assert_eq!(store.acquire_lease("b", minute).await.unwrap(), None);
    store
        .write_status(&id, &update("by a"), first)
        .await
        .unwrap();

    // a's lease lapses (a was paused past it): b takes over.
    sqlx::query("UPDATE sandbox_leader SET expires_at = now()")
        .execute(&env.pool)
        .await
        .unwrap();
    let second = store.acquire_lease("b", minute).await.unwrap().unwrap();
    assert_eq!(second, Term(first.0 + 1));
    assert!(!store.renew_lease("a", first, minute).await.unwrap());

    let late = store.write_status(&id, &update("late, by a"), first).await;
    assert!(
        matches!(late, Err(StoreError::Fenced { term }) if term == first),
        "{late:?}"
    );
    let late = store.delete_status(&id, first).await;
    assert!(
        matches!(late, Err(StoreError::Fenced { term }) if term == first),
        "{late:?}"
    );
    let row = store.fetch_status(&id).await.unwrap().expect("kept");
    assert_eq!(row.message, "by a");

    store
        .write_status(&id, &update("by b"), second)
        .await
        .unwrap();
    assert_eq!(status_term(&env, &id).await, Some(second.0));
    store.delete_status(&id, second).await.unwrap();
    assert!(store.fetch_status(&id).await.unwrap().is_none());

    // A write by hand without a term is refused too, with a hint.
    let err = sqlx::query("INSERT INTO sandbox_status (id, phase) VALUES ('forged', 'ready')")
        .execute(&env.admin_pool)
        .await
        .unwrap_err();
    let db = err.as_database_error().unwrap();
    assert_eq!(db.code().as_deref(), Some("SX001"));
    assert!(
        db.message().contains("not the current leader"),
        "{}",
        db.message()
    );
    // The lease is sandboxd's own: an orchestrator can neither take it
    // nor read it.
    let (orchestrator, _) = env.create_login_role("lease_thief").await;
    sqlx::query("SELECT sandbox_grant_orchestrator('lease_thief', false)")
        .execute(&env.pool)
        .await
        .unwrap();
    for sql in [
        "SELECT sandbox_lease_acquire('thief', 60000)",
        "SELECT * FROM sandbox_leader",
    ] {
        let refused = sqlx::query(sql).execute(&orchestrator).await;
        assert!(refused.is_err(), "{sql} must be refused to an orchestrator");
    }
}

#[tokio::test]
async fn three_replicas_elect_one_leader_and_a_killed_leader_is_replaced_within_the_lease_without_provisioning_twice(
) {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let started = Utc::now().timestamp() - 1;
    let [a, b, c] = three_replicas(&env).await;
    assert_eq!(metric(&b, "sandboxd_leader").await, Some(0.0));
    assert_eq!(metric(&a, "sandboxd_leader").await, Some(1.0));

    let first = sandbox_id("lead");
    let before = client
        .provision(&first, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();

    a.process.signal("KILL");
    let killed = tokio::time::Instant::now();
    let (holder, term) = eventually("a standby takes the lease over", TEST_LEASE * 3, || async {
        lease(&env).await.filter(|(h, _)| h != "a")
    })
    .await;
    let took = killed.elapsed();
    let policy = sandboxd::domain::lease::LeasePolicy::new(TEST_LEASE).unwrap();
    assert!(
        took <= policy.takeover_within() + Duration::from_secs(2),
        "{holder} took over {took:?} after the kill (lease {TEST_LEASE:?})"
    );
    assert_eq!(term, 2);
    let leader = if holder == "b" { &b } else { &c };
    wait_leading(leader).await;

    let second = sandbox_id("lead");
    client
        .provision(&second, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let after = client.status(&first).await.unwrap().unwrap();
    assert_eq!(
        after.services["postgres"].instance, before.services["postgres"].instance,
        "the first sandbox was adopted, not provisioned again"
    );
    assert_eq!(creates(&env, &first, started).len(), 1, "created once");
    assert_eq!(creates(&env, &second, started).len(), 1, "created once");
    assert_eq!(status_term(&env, &second).await, Some(2));
    assert_eq!(
        metric(leader, "sandboxd_leader_takeovers_total").await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_leader_paused_past_its_lease_and_resumed_changes_no_container_and_writes_no_status() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let started = Utc::now().timestamp() - 1;
    let [a, b, c] = three_replicas(&env).await;

    let first = sandbox_id("pause");
    let before = client
        .provision(&first, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let first_term = status_term(&env, &first).await;

    // a stops (SIGSTOP) past its lease; a standby takes over...
    a.process.signal("STOP");
    let (holder, _) = eventually("a standby takes over", TEST_LEASE * 3, || async {
        lease(&env).await.filter(|(h, _)| h != "a")
    })
    .await;
    let (next, last) = if holder == "b" { (&b, &c) } else { (&c, &b) };
    wait_leading(next).await;
    // ...and stops too, so that right after a resumes, nothing but a could
    // act: a row asked for now is what a would provision if it still
    // believed it led.
    next.process.signal("STOP");
    let second = sandbox_id("pause");
    let generation = client
        .apply(&second, &request(&["redis"], &[]))
        .await
        .unwrap();
    a.process.signal("CONT");

    // The third replica takes over once the second's lease lapses, or a,
    // resumed, wins that election itself (a new term is a fair win): either
    // way only term 3 may act.
    let status = client
        .wait_ready(&second, &generation, READY)
        .await
        .unwrap();
    let (winner, term) = lease(&env).await.expect("a lease");
    assert_eq!(term, 3);
    assert!(winner == last.name || winner == "a", "won by {winner}");
    assert_eq!(
        status_term(&env, &second).await,
        Some(3),
        "written by term 3 only"
    );
    let made = env.containers(Some(&second)).await;
    assert_eq!(made.len(), 1);
    let labels = docker_labels(&made[0].name);
    assert_eq!(labels.get(TERM_LABEL).map(String::as_str), Some("3"));
    assert_eq!(
        creates(&env, &second, started).len(),
        1,
        "created once, by term 3"
    );
    assert!(status.services.contains_key("redis"));

    // a left the first sandbox alone too.
    let after = client.status(&first).await.unwrap().unwrap();
    assert_eq!(
        after.services["redis"].instance,
        before.services["redis"].instance
    );
    assert_eq!(creates(&env, &first, started).len(), 1);
    assert_eq!(status_term(&env, &first).await, first_term);

    // a knows it lost the term it was paused in.
    if winner == last.name {
        eventually("a stands by", Duration::from_secs(20), || async {
            (metric(&a, "sandboxd_leader").await? == 0.0
                && metric(&a, "sandboxd_leader_losses_total").await? == 1.0)
                .then_some(())
        })
        .await;
        wait_standby(&a, last.name).await;
    } else {
        eventually(
            "a saw its old term lost",
            Duration::from_secs(20),
            || async { (metric(&a, "sandboxd_leader_losses_total").await? == 1.0).then_some(()) },
        )
        .await;
    }
    next.process.signal("CONT");
}

/// The labels of the container `name`.
fn docker_labels(name: &str) -> std::collections::HashMap<String, String> {
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{json .Config.Labels}}", name])
        .output()
        .expect("run docker inspect");
    assert!(out.status.success(), "docker inspect {name} failed");
    serde_json::from_slice(&out.stdout).expect("labels as JSON")
}

#[tokio::test]
async fn a_standby_says_who_leads_and_a_clean_shutdown_hands_over_at_once() {
    let env = TestEnv::new().await;
    let a = replica(&env, "a");
    wait_leading(&a).await;
    let b = replica(&env, "b");
    wait_standby(&b, "a").await;
    let (_, body) = readyz(&b).await.unwrap();
    assert!(body.contains("term 1"), "{body}");
    assert!(body.contains("this process (b)"), "{body}");

    a.process.signal("TERM");
    let stopped = tokio::time::Instant::now();
    wait_leading(&b).await;
    // Released, not expired: the standby's next try wins.
    let policy = sandboxd::domain::lease::LeasePolicy::new(TEST_LEASE).unwrap();
    assert!(
        stopped.elapsed() < TEST_LEASE,
        "took {:?}; a lease of {TEST_LEASE:?} renewed every {:?}",
        stopped.elapsed(),
        policy.renew_every()
    );
    assert_eq!(lease(&env).await, Some(("b".to_owned(), 2)));
}
