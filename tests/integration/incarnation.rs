//! Incarnations on the real Docker engine and Postgres: the database gives
//! every inserted row an incarnation of its own and keeps it while the row
//! exists; a row deleted and inserted again never inherits the earlier
//! incarnation's containers, data or credentials, and a waiter never
//! accepts the earlier incarnation's status.

use crate::common;

use common::{eventually, host_pg_url, request, sandbox_id, TestEnv};
use sandboxd::client::{Client, Revision};
use sandboxd::config::ControllerConfig;
use sandboxd::domain::{Incarnation, Phase, SandboxId, SandboxStatus};
use sqlx::Connection;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

/// A grace window long enough that a released sandbox's containers still
/// exist when its id is inserted again.
fn config(env: &TestEnv) -> ControllerConfig {
    let mut config = env.config();
    config.grace = Duration::from_secs(600);
    config
}

async fn incarnation_of(pool: &sqlx::PgPool, id: &str) -> String {
    sqlx::query_scalar("SELECT incarnation::text FROM sandbox_desired WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_database_owns_the_incarnation_a_new_one_per_insert_kept_by_every_update() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("inc");

    // A value given on insert is replaced.
    let given = "00000000-0000-4000-8000-000000000000";
    sqlx::query(
        "INSERT INTO sandbox_desired (id, services, incarnation) VALUES ($1, '{redis}', $2::uuid)",
    )
    .bind(id.as_str())
    .bind(given)
    .execute(&env.pool)
    .await
    .unwrap();
    let first = incarnation_of(&env.pool, id.as_str()).await;
    assert_ne!(first, given);
    assert!(Incarnation::parse(&first).is_ok(), "{first}");

    // An update keeps it, without a new generation.
    let generation: i64 = sqlx::query_scalar(
        "UPDATE sandbox_desired SET incarnation = $2::uuid WHERE id = $1 RETURNING generation",
    )
    .bind(id.as_str())
    .bind(given)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(generation, 1);
    assert_eq!(incarnation_of(&env.pool, id.as_str()).await, first);

    // The upsert and sandbox_request keep it, and say which it is.
    let applied = client
        .apply(&id, &request(&["redis", "postgres"], &[]))
        .await
        .unwrap();
    assert_eq!(applied.incarnation.as_str(), first);
    assert_eq!(applied.generation, 2);
    let requested = client
        .request(
            &id,
            &sandboxd::client::Request {
                services: vec!["mongo".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(requested.incarnation.as_str(), first);
    assert_eq!(requested.generation, 3);

    // Deleted and inserted again: another incarnation.
    assert!(client.release(&id).await.unwrap());
    let again = client.apply(&id, &request(&["redis"], &[])).await.unwrap();
    assert_ne!(again.incarnation.as_str(), first);
    assert_eq!(again.generation, 1);

    // A first request creates a row with an incarnation of its own too.
    let fresh = sandbox_id("inc");
    let created = client
        .request(
            &fresh,
            &sandboxd::client::Request {
                services: vec!["redis".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        created.incarnation.as_str(),
        incarnation_of(&env.pool, fresh.as_str()).await
    );
    assert_ne!(created.incarnation, again.incarnation);

    // An orchestrator role reads the incarnation and cannot set it.
    let (agents, _) = env.create_login_role("agents").await;
    sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY)
        .grant_orchestrator("agents", true)
        .await
        .unwrap();
    let theirs = sandbox_id("inc");
    let mut ask = request(&["redis"], &[]);
    ask.owner = String::new();
    let revision = Client::from_pool(agents.clone())
        .apply(&theirs, &ask)
        .await
        .unwrap();
    sqlx::query("UPDATE sandbox_desired SET incarnation = $2::uuid WHERE id = $1")
        .bind(theirs.as_str())
        .bind(given)
        .execute(&agents)
        .await
        .unwrap();
    assert_eq!(
        incarnation_of(&agents, theirs.as_str()).await,
        revision.incarnation.as_str()
    );
}

/// Connects to the sandbox's Postgres with its published credentials.
async fn connect(status: &SandboxStatus) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("log in with the published credentials")
}

#[tokio::test]
async fn delete_and_re_insert_with_another_service_the_waiter_gets_the_new_incarnation_and_the_old_data_is_not_visible(
) {
    let env = TestEnv::new().await;
    let controller = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("reinsert");

    let old_revision = client
        .apply(&id, &request(&["postgres"], &[]))
        .await
        .unwrap();
    let old = client.wait_ready(&id, &old_revision, READY).await.unwrap();
    assert_eq!(old.incarnation.as_ref(), Some(&old_revision.incarnation));
    let mut conn = connect(&old).await;
    for sql in [
        "CREATE TABLE agent_notes (note text)",
        "INSERT INTO agent_notes VALUES ('secret')",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    let old_containers = env.containers(Some(&id)).await;
    assert_eq!(old_containers.len(), 1);

    // Released: its container waits out the (long) grace window.
    assert!(client.release(&id).await.unwrap());
    eventually(
        "the sandbox is terminating",
        Duration::from_secs(10),
        || async {
            client
                .status(&id)
                .await
                .unwrap()
                .filter(|s| s.phase == Phase::Terminating)
        },
    )
    .await;
    assert_eq!(env.containers(Some(&id)).await.len(), 1, "still there");

    // The same id again, with another service.
    let revision = client
        .apply(&id, &request(&["postgres", "redis"], &[]))
        .await
        .unwrap();
    assert_ne!(revision.incarnation, old_revision.incarnation);
    let status = client.wait_ready(&id, &revision, READY).await.unwrap();
    assert_eq!(status.incarnation.as_ref(), Some(&revision.incarnation));
    assert_eq!(status.observed_generation, revision.generation);
    assert!(status.services.contains_key("redis"));
    let (pg, old_pg) = (&status.services["postgres"], &old.services["postgres"]);
    assert_ne!(pg.password.expose(), old_pg.password.expose());
    assert_ne!(pg.instance, old_pg.instance);

    // The old data is not visible: a new, empty database.
    let mut conn = connect(&status).await;
    let notes: Option<String> = sqlx::query_scalar("SELECT to_regclass('agent_notes')::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(notes, None, "the earlier incarnation's table is not there");
    conn.close().await.unwrap();
    assert!(
        sqlx::PgConnection::connect(&host_pg_url(old_pg))
            .await
            .is_err(),
        "the earlier incarnation's credentials no longer log in"
    );

    // Only the new incarnation's containers are left.
    let containers = env.containers(Some(&id)).await;
    assert_eq!(containers.len(), 2, "{containers:?}");
    for c in &containers {
        assert_eq!(
            c.labels.incarnation.as_deref(),
            Some(revision.incarnation.as_str())
        );
        assert!(old_containers.iter().all(|o| o.id != c.id));
    }
    assert!(controller
        .metrics
        .render()
        .contains("sandboxd_reaps_total{reason=\"superseded\"} 1"));
    controller.stop().await;
}

#[tokio::test]
async fn a_waiter_never_accepts_the_earlier_incarnations_ready_status_at_a_higher_generation() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id: SandboxId = sandbox_id("racing");
    let controller = env.start(config(&env));
    let ask = sandboxd::client::Request {
        services: vec!["redis".into()],
        ..Default::default()
    };
    client.request_and_wait(&id, &ask, READY).await.unwrap();
    let old = client.request_and_wait(&id, &ask, READY).await.unwrap();
    assert_eq!(old.observed_generation, 2);
    controller.stop().await;

    // Deleted and inserted again in one transaction, while no controller
    // runs: the status row is still the earlier incarnation's, ready, at a
    // generation past the new row's.
    let mut tx = env.pool.begin().await.unwrap();
    sqlx::query("DELETE FROM sandbox_desired WHERE id = $1")
        .bind(id.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let (generation, incarnation): (i64, String) = sqlx::query_as(
        "INSERT INTO sandbox_desired (id, owner, services) VALUES ($1, 'test', '{redis}')
         RETURNING generation, incarnation::text",
    )
    .bind(id.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let revision = Revision {
        generation,
        incarnation: Incarnation::parse(&incarnation).unwrap(),
    };
    let stale = client.status(&id).await.unwrap().unwrap();
    assert_eq!(stale.phase, Phase::Ready);
    assert!(stale.observed_generation >= revision.generation);
    assert_ne!(stale.incarnation.as_ref(), Some(&revision.incarnation));

    // Not accepted while it is all there is.
    let early = client
        .wait_ready(&id, &revision, Duration::from_secs(2))
        .await
        .expect_err("the earlier incarnation's status is never accepted");
    assert!(
        matches!(early, sandboxd::client::ClientError::Timeout { .. }),
        "{early}"
    );

    // Once a controller runs, the new incarnation's status replaces it.
    let controller = env.start(config(&env));
    let status = client.wait_ready(&id, &revision, READY).await.unwrap();
    assert_eq!(status.incarnation.as_ref(), Some(&revision.incarnation));
    assert_ne!(
        status.services["redis"].password.expose(),
        old.services["redis"].password.expose()
    );
    controller.stop().await;
}
