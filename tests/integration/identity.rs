//! State database identity on the real Docker engine and Postgres: a
//! controller of the same deployment pointed at another state database (a
//! fresh, empty one, so another identity) never removes, heals or replaces
//! the first one's containers, network or volumes, however long it runs;
//! it counts them, and a row of its own whose container name they hold
//! ends `failed` saying why.

use crate::common;

use common::{eventually, request, sandbox_id, StatePostgres, TestEnv};
use sandboxd::adapters::PgStore;
use sandboxd::client::{Client, ClientError};
use sandboxd::config::ControllerConfig;
use sandboxd::domain::container::ContainerState;
use sandboxd::domain::labels;
use sandboxd::domain::{Phase, SandboxStatus};
use sandboxd::metrics::Metrics;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);
/// Short, so that the second controller is well past it.
const GRACE: Duration = Duration::from_secs(2);

fn config(env: &TestEnv) -> ControllerConfig {
    let mut config = env.config();
    config.grace = GRACE;
    config.relist_interval = Duration::from_secs(1);
    config
}

/// The value of the metric line starting with `name ` (no labels).
fn metric(metrics: &Metrics, name: &str) -> f64 {
    let text = metrics.render();
    common::sample(&text, name).unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// The sum of a labelled counter over its label values.
fn total(metrics: &Metrics, name: &str) -> f64 {
    common::total(&metrics.render(), name)
}

/// Logs in to the sandbox's Redis with its published credentials.
async fn redis_answers(status: &SandboxStatus) {
    let redis = &status.services["redis"];
    let c = redis::Client::open(format!(
        "redis://:{}@127.0.0.1:{}/0",
        redis.password.expose(),
        redis.host_port
    ))
    .unwrap();
    let mut con = c
        .get_multiplexed_async_connection()
        .await
        .expect("log in with the published credentials");
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn a_controller_on_another_state_database_never_removes_the_first_ones_sandbox_and_counts_it()
{
    let env = TestEnv::new().await;
    let first = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ident");
    let mut req = request(&["redis"], &[]);
    req.persistent = true;
    let status = client.provision(&id, &req, READY).await.unwrap();
    let container = env
        .containers(Some(&id))
        .await
        .into_iter()
        .find(|c| c.state == ContainerState::Running)
        .expect("a running container");
    let state_id: String = sqlx::query_scalar("SELECT state_id::text FROM sandbox_identity")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        container.labels.state_id.as_deref(),
        Some(state_id.as_str())
    );
    let network = status.network.clone().expect("a network");
    let network_labels = env
        .docker
        .inspect_network(
            &network,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .unwrap()
        .labels
        .unwrap_or_default();
    assert_eq!(network_labels.get(labels::STATE_ID), Some(&state_id));
    let volume = env.docker.inspect_volume(&container.name).await.unwrap();
    assert_eq!(volume.labels.get(labels::STATE_ID), Some(&state_id));

    // The same deployment, pointed at a fresh, empty state database: the
    // first database's sandbox is foreign to it.
    let empty = StatePostgres::start().await;
    let store = PgStore::connect(&empty.url, 4, sandboxd::engine::REGISTRY)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let other: String = sqlx::query_scalar("SELECT state_id::text FROM sandbox_identity")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_ne!(other, state_id, "a new database has an identity of its own");
    let second = env.start_with_store(config(&env), store.clone());
    let metrics = second.metrics.clone();
    eventually(
        "the second controller is ready",
        Duration::from_secs(10),
        || async { second.readiness.is_ready().then_some(()) },
    )
    .await;
    eventually(
        "the second controller counts the foreign container",
        Duration::from_secs(10),
        || async { (metric(&metrics, "sandboxd_foreign_containers") == 1.0).then_some(()) },
    )
    .await;

    // Well past its grace window, with a relist every second.
    tokio::time::sleep(GRACE * 4).await;
    let now = env.containers(Some(&id)).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].id, container.id, "the same container");
    assert_eq!(now[0].state, ContainerState::Running);
    assert!(env
        .docker
        .inspect_network(
            &network,
            None::<bollard::query_parameters::InspectNetworkOptions>
        )
        .await
        .is_ok());
    assert!(env.docker.inspect_volume(&container.name).await.is_ok());
    assert_eq!(total(&metrics, "sandboxd_reaps_total"), 0.0);
    assert_eq!(metric(&metrics, "sandboxd_foreign_containers"), 1.0);

    // A row of the second database for the same id: its name is held.
    let other_client = Client::from_pool(store.pool().clone());
    let err = other_client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .expect_err("the name is another database's");
    let ClientError::Failed { message, .. } = &err else {
        panic!("expected a failed sandbox, got {err}");
    };
    for fragment in [
        "held by container",
        &container.name,
        &state_id,
        &other,
        "docker rm -f",
    ] {
        assert!(message.contains(fragment), "{fragment}: {message}");
    }
    let now = env.containers(Some(&id)).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].id, container.id, "not replaced");

    // The first database's sandbox still serves its credentials.
    let still = client.status(&id).await.unwrap().unwrap();
    assert_eq!(still.phase, Phase::Ready);
    assert_eq!(still.services, status.services);
    redis_answers(&still).await;

    second.stop().await;
    first.stop().await;
}

#[tokio::test]
async fn the_identity_of_a_state_database_cannot_be_changed_or_deleted() {
    let env = TestEnv::new().await;
    let before: String = sqlx::query_scalar("SELECT state_id::text FROM sandbox_identity")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    for sql in [
        "UPDATE sandbox_identity SET state_id = gen_random_uuid()",
        "DELETE FROM sandbox_identity",
        "TRUNCATE sandbox_identity",
        "INSERT INTO sandbox_identity (singleton) VALUES (true)",
    ] {
        let err = sqlx::query(sql)
            .execute(&env.admin_pool)
            .await
            .expect_err(sql);
        let message = err.to_string();
        assert!(
            message.contains("cannot change") || message.contains("duplicate key"),
            "{sql}: {message}"
        );
    }
    // Migrating again keeps it.
    PgStore::connect(&env.url, 1, sandboxd::engine::REGISTRY)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let after: String = sqlx::query_scalar("SELECT state_id::text FROM sandbox_identity")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(after, before);
}
