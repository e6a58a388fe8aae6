//! The additive request verb, touch and release against the real
//! controller on the real Docker engine: a request adds to a sandbox and
//! never tears anything down, a request retries a failed sandbox at once,
//! a touch records a use without waking the controller, a release tears the
//! sandbox down.

use crate::common;

use common::{eventually, sandbox_id, Agent, TestEnv};
use sandboxd::client::{Client, ClientError, Request};
use sandboxd::domain::container::{ContainerState, ObservedContainer};
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(90);

/// A request for `services` with `(engine, feature)` pairs.
fn ask(services: &[&str], features: &[(&str, &str)]) -> Request {
    let mut f: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (engine, feature) in features {
        f.entry((*engine).into())
            .or_default()
            .insert((*feature).into());
    }
    Request {
        services: services.iter().map(|s| s.to_string()).collect(),
        features: f,
        ..Request::default()
    }
}

/// The running containers of the sandbox, by engine.
async fn running(env: &TestEnv, id: &SandboxId) -> BTreeMap<String, ObservedContainer> {
    env.containers(Some(id))
        .await
        .into_iter()
        .filter(|c| c.state == ContainerState::Running)
        .map(|c| (c.labels.engine.clone(), c))
        .collect()
}

/// The row's services and features.
async fn row(env: &TestEnv, id: &SandboxId) -> (Vec<String>, serde_json::Value) {
    sqlx::query_as("SELECT services, features FROM sandbox_desired WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

fn instance(status: &SandboxStatus, engine: &str) -> String {
    status.services[engine].instance.clone()
}

#[tokio::test]
async fn requests_add_engines_and_features_to_a_sandbox_and_never_tear_anything_down() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("req");

    // Postgres.
    let first = client
        .request_and_wait(&id, &ask(&["postgres"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(first.observed_generation, 1);
    let pg = instance(&first, "postgres");
    let pg_container = running(&env, &id).await["postgres"].id.clone();

    // Redis only: added next to Postgres, which is left alone.
    let second = client
        .request_and_wait(&id, &ask(&["redis"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(second.observed_generation, 2);
    assert_eq!(instance(&second, "postgres"), pg, "postgres is untouched");
    assert_eq!(
        second.services["postgres"].password,
        first.services["postgres"].password
    );
    let redis = instance(&second, "redis");
    assert_eq!(
        row(&env, &id).await,
        (
            vec!["postgres".to_owned(), "redis".into()],
            serde_json::json!({})
        )
    );
    let containers = running(&env, &id).await;
    assert_eq!(containers.keys().collect::<Vec<_>>(), ["postgres", "redis"]);
    assert_eq!(containers["postgres"].id, pg_container);

    // A subset: a cache hit, ready again at the new generation.
    let third = client
        .request_and_wait(&id, &ask(&["postgres"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(third.phase, Phase::Ready);
    assert_eq!(third.observed_generation, 3);
    assert_eq!(instance(&third, "postgres"), pg);
    assert_eq!(instance(&third, "redis"), redis);
    assert_eq!(running(&env, &id).await["postgres"].id, pg_container);

    // A feature: Postgres rotates to the union; Redis stays.
    let fourth = client
        .request_and_wait(&id, &ask(&["postgres"], &[("postgres", "pg_trgm")]), READY)
        .await
        .unwrap();
    assert_eq!(fourth.observed_generation, 4);
    assert_ne!(instance(&fourth, "postgres"), pg, "postgres rotated");
    assert!(
        fourth.services["postgres"]
            .available_extensions
            .iter()
            .any(|e| e == "pg_trgm"),
        "{:?}",
        fourth.services["postgres"].available_extensions
    );
    assert_eq!(instance(&fourth, "redis"), redis, "redis is untouched");
    assert_eq!(
        row(&env, &id).await,
        (
            vec!["postgres".to_owned(), "redis".into()],
            serde_json::json!({"postgres": ["pg_trgm"]})
        )
    );

    // Asking for less than it has, features included, changes nothing.
    let fifth = client
        .request_and_wait(&id, &ask(&["redis"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(fifth.observed_generation, 5);
    assert_eq!(instance(&fifth, "postgres"), instance(&fourth, "postgres"));
    assert_eq!(instance(&fifth, "redis"), redis);
    let containers = running(&env, &id).await;
    assert_eq!(containers.keys().collect::<Vec<_>>(), ["postgres", "redis"]);
    assert_eq!(
        env.containers(Some(&id)).await.len(),
        2,
        "one container per engine, nothing left over"
    );
    controller.stop().await;
}

/// The value of a counter in the controller's `/metrics` text.
fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test]
async fn a_request_retries_a_failed_sandbox_at_once_instead_of_waiting_out_its_backoff() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("retry");
    // The agent does not exist yet: attaching it fails, again and again.
    let agent_name = format!("agent-{}-{}", env.deployment, id);
    let mut req = ask(&["redis"], &[]);
    req.attach = vec![agent_name.clone()];
    // The owner the agent opts in for.
    req.owner = Some(common::OWNER.into());
    match client.request_and_wait(&id, &req, READY).await {
        Err(ClientError::Failed { message, .. }) => {
            assert!(message.contains(&agent_name), "{message}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }

    // Let the backoff grow: after the 6th failure in a row the next retry
    // is 0.5 s × 2^5 = 16 s away.
    const ERRORS: &str =
        r#"controller_runtime_reconcile_total{controller="sandbox",result="error"}"#;
    eventually(
        "six failed reconciles in a row",
        Duration::from_secs(60),
        || async { (counter(&controller.metrics.render(), ERRORS) >= 6).then_some(()) },
    )
    .await;

    // The cause goes away, and the agent asks again: ready long before the
    // 16 s backoff is over.
    let _agent = Agent::start(&agent_name);
    let asked = Instant::now();
    let status = client
        .request_and_wait(&id, &ask(&["redis"], &[]), Duration::from_secs(30))
        .await
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(status.phase, Phase::Ready);
    assert!(
        took < Duration::from_secs(8),
        "a request must retry at once, not after the backoff: ready after {took:?}"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_touch_records_a_use_without_a_new_generation_and_fails_once_the_sandbox_is_going() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("touch");
    let ready = client
        .request_and_wait(&id, &ask(&["redis"], &[]), READY)
        .await
        .unwrap();
    let clock = || async {
        sqlx::query_as::<
            _,
            (
                i64,
                chrono::DateTime<chrono::Utc>,
                chrono::DateTime<chrono::Utc>,
            ),
        >("SELECT generation, updated_at, last_used_at FROM sandbox_desired WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(&env.pool)
        .await
        .unwrap()
    };
    let (generation, updated, used) = clock().await;

    assert!(client.touch(&id).await.unwrap());
    let (generation_after, updated_after, used_after) = clock().await;
    assert_eq!(generation_after, generation);
    assert_eq!(updated_after, updated);
    assert!(used_after > used, "{used_after} > {used}");
    // The controller was not asked to look: the status stays as it was.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = client.status(&id).await.unwrap().unwrap();
    assert_eq!(status.observed_generation, ready.observed_generation);
    assert_eq!(status.updated_at, ready.updated_at);

    let missing = sandbox_id("missing");
    assert!(!client.touch(&missing).await.unwrap());

    // Expired: being torn down, so it may be touched no more.
    sqlx::query("UPDATE sandbox_desired SET expires_at = now() WHERE id = $1")
        .bind(id.as_str())
        .execute(&env.pool)
        .await
        .unwrap();
    eventually("the sandbox terminating", READY, || async {
        let s = client.status(&id).await.unwrap()?;
        (s.phase == Phase::Terminating).then_some(())
    })
    .await;
    assert!(!client.touch(&id).await.unwrap());
    controller.stop().await;
}

#[tokio::test]
async fn a_release_deletes_the_row_and_the_controller_tears_the_sandbox_down() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("rel");
    client
        .request_and_wait(&id, &ask(&["postgres", "redis"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(running(&env, &id).await.len(), 2);

    assert!(client.release(&id).await.unwrap());
    eventually("containers and status gone", READY, || async {
        let gone = env.containers(Some(&id)).await.is_empty()
            && client.status(&id).await.unwrap().is_none();
        gone.then_some(())
    })
    .await;
    assert!(!client.release(&id).await.unwrap(), "released once");
    assert!(!client.touch(&id).await.unwrap());

    // Requested again, it comes back from scratch.
    let again = client
        .request_and_wait(&id, &ask(&["redis"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(again.observed_generation, 1);
    assert_eq!(
        running(&env, &id).await.keys().collect::<Vec<_>>(),
        ["redis"]
    );
    controller.stop().await;
}
