//! Deletion safety on the real Docker engine and Postgres: a missing row is
//! a deletion only after the grace window counted from when the controller
//! saw it gone, so a `TRUNCATE sandbox_desired` removes nothing at once,
//! and a controller pointed at an empty state database (another identity,
//! see `tests/integration/identity.rs`) removes nothing at all.

use crate::common;

use chrono::{DateTime, Utc};
use common::{eventually, request, sandbox_id, StatePostgres, TestEnv};
use sandboxd::adapters::PgStore;
use sandboxd::client::Client;
use sandboxd::config::ControllerConfig;
use sandboxd::domain::container::{ContainerState, ObservedContainer};
use sandboxd::domain::{Phase, SandboxId};
use sandboxd::metrics::Metrics;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);
/// Short, so the tests are; long enough to look inside it twice.
const GRACE: Duration = Duration::from_secs(3);

fn config(env: &TestEnv) -> ControllerConfig {
    let mut config = env.config();
    config.grace = GRACE;
    // Too slow to matter: only a NOTIFY (or the start) makes it relist.
    config.relist_interval = Duration::from_secs(3600);
    config
}

/// The sandbox's one running container.
async fn running(env: &TestEnv, id: &SandboxId) -> Option<ObservedContainer> {
    env.containers(Some(id))
        .await
        .into_iter()
        .find(|c| c.state == ContainerState::Running)
}

/// Provisions a redis sandbox and waits until its container is older than
/// the grace window, so that only the time the row was seen gone keeps it.
async fn old_sandbox(
    env: &TestEnv,
    client: &Client,
    prefix: &str,
) -> (SandboxId, ObservedContainer) {
    let id = sandbox_id(prefix);
    client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let container = running(env, &id).await.expect("a running container");
    sleep_until(container.created + GRACE + Duration::from_millis(500)).await;
    (id, container)
}

async fn sleep_until(t: DateTime<Utc>) {
    if let Ok(d) = (t - Utc::now()).to_std() {
        tokio::time::sleep(d).await;
    }
}

/// Asserts that `container` is still the sandbox's running container.
async fn still_running(env: &TestEnv, id: &SandboxId, container: &ObservedContainer, when: &str) {
    let now = running(env, id).await.map(|c| c.id);
    assert_eq!(
        now.as_ref(),
        Some(&container.id),
        "{when}: the container must still run"
    );
}

/// Waits until nothing of the sandbox runs and returns when that was seen.
async fn reaped(env: &TestEnv, id: &SandboxId) -> DateTime<Utc> {
    eventually(
        "the container is reaped",
        Duration::from_secs(20),
        || async { env.containers(Some(id)).await.is_empty().then(Utc::now) },
    )
    .await
}

#[tokio::test]
async fn a_truncated_desired_table_removes_nothing_until_the_grace_window_from_the_truncate_has_passed(
) {
    let env = TestEnv::new().await;
    let controller = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let (id, container) = old_sandbox(&env, &client, "trunc").await;
    let relists_before = relists(&controller.metrics);

    let before = Utc::now();
    sqlx::query("TRUNCATE sandbox_desired")
        .execute(&env.pool)
        .await
        .unwrap();
    // The NOTIFY made it relist and look at the sandbox: it waits.
    let status = eventually("phase terminating", Duration::from_secs(5), || async {
        client
            .status(&id)
            .await
            .unwrap()
            .filter(|s| s.phase == Phase::Terminating)
    })
    .await;
    assert!(status.message.contains("grace"), "{}", status.message);
    // (The relist counts itself once it has enqueued every sandbox, so the
    // status may change a moment before the count does.)
    eventually("the truncate relisted", Duration::from_secs(5), || async {
        (relists(&controller.metrics) > relists_before).then_some(())
    })
    .await;
    sleep_until(before + Duration::from_secs(1)).await;
    still_running(&env, &id, &container, "1 s after the truncate").await;
    sleep_until(before + GRACE - Duration::from_millis(500)).await;
    still_running(&env, &id, &container, "just inside the grace window").await;

    let gone = reaped(&env, &id).await;
    assert!(
        (gone - before).to_std().unwrap_or_default() >= GRACE,
        "reaped {} after the truncate",
        gone - before
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_second_controller_on_an_empty_state_database_never_reaps_the_first_ones_containers() {
    let env = TestEnv::new().await;
    let first = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let (id, container) = old_sandbox(&env, &client, "empty").await;
    first.stop().await;

    // The same deployment, pointed at a fresh, empty state database (another
    // identity): every container it finds is another database's.
    let empty = StatePostgres::start().await;
    let store = PgStore::connect(&empty.url, 4, sandboxd::engine::REGISTRY)
        .await
        .expect("connect the empty state database");
    store
        .migrate()
        .await
        .expect("migrate the empty state database");
    let started = Utc::now();
    let second = env.start_with_store(config(&env), store);
    eventually(
        "the second controller is ready",
        Duration::from_secs(10),
        || async { second.readiness.is_ready().then_some(()) },
    )
    .await;
    sleep_until(Utc::now() + Duration::from_secs(1)).await;
    still_running(&env, &id, &container, "1 s after the start").await;
    sleep_until(started + GRACE - Duration::from_millis(500)).await;
    still_running(&env, &id, &container, "just inside the grace window").await;

    sleep_until(started + GRACE * 3).await;
    still_running(&env, &id, &container, "well past the grace window").await;
    second.stop().await;
}

/// A sample of the controller's metrics.
fn metric(metrics: &Metrics, name: &str) -> f64 {
    common::sample(&metrics.render(), name).unwrap_or_else(|| panic!("no metric {name}"))
}

/// `sandboxd_relists_total` of a running controller.
fn relists(metrics: &Metrics) -> f64 {
    metric(metrics, "sandboxd_relists_total")
}

/// Truncates the desired table and waits for the controller to pause
/// reaping.
async fn truncate_and_see_reaping_paused(env: &TestEnv, controller: &common::RunningController) {
    sqlx::query("TRUNCATE sandbox_desired")
        .execute(&env.pool)
        .await
        .unwrap();
    eventually("reaping paused", Duration::from_secs(10), || async {
        (metric(&controller.metrics, "sandboxd_reaping_paused") == 1.0).then_some(())
    })
    .await;
}

/// `n` redis sandboxes, requested at once, all ready.
async fn ready_sandboxes(client: &Client, prefix: &str, n: usize) -> Vec<SandboxId> {
    let mut sandboxes = Vec::new();
    let mut revisions = Vec::new();
    for _ in 0..n {
        let id = sandbox_id(prefix);
        revisions.push(client.apply(&id, &request(&["redis"], &[])).await.unwrap());
        sandboxes.push(id);
    }
    for (id, revision) in sandboxes.iter().zip(&revisions) {
        client.wait_ready(id, revision, READY).await.unwrap();
    }
    sandboxes
}

#[tokio::test]
async fn truncating_the_desired_table_of_many_sandboxes_pauses_reaping_until_resume_reaping() {
    let env = TestEnv::new().await;
    let controller = env.start(config(&env));
    let client = Client::from_pool(env.pool.clone());
    let sandboxes = ready_sandboxes(&client, "burst", 5).await;
    let containers: Vec<ObservedContainer> = {
        let mut v = Vec::new();
        for id in &sandboxes {
            v.push(running(&env, id).await.expect("running"));
        }
        v
    };

    truncate_and_see_reaping_paused(&env, &controller).await;
    assert_eq!(
        metric(&controller.metrics, "sandboxd_sandboxes_row_missing"),
        5.0
    );
    let (paused, reason): (bool, String) =
        sqlx::query_as("SELECT paused, reason FROM sandbox_reaping")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(paused);
    assert!(reason.contains("5 of 5 sandboxes"), "{reason}");

    // Well past the grace window: nothing was removed.
    tokio::time::sleep(GRACE * 2).await;
    for (id, container) in sandboxes.iter().zip(&containers) {
        still_running(&env, id, container, "while reaping is paused").await;
    }

    // The operator checked: the deletions are real.
    let out = std::process::Command::new(common::BIN)
        .arg("resume-reaping")
        .env("DATABASE_URL", &env.url)
        .output()
        .expect("run sandboxd resume-reaping");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("reaping resumed; it had been paused since"),
        "{said}"
    );
    assert!(said.contains("5 of 5 sandboxes"), "{said}");
    for id in &sandboxes {
        reaped(&env, id).await;
    }
    assert_eq!(metric(&controller.metrics, "sandboxd_reaping_paused"), 0.0);

    // A second resume has nothing to do, and says so.
    let out = std::process::Command::new(common::BIN)
        .arg("resume-reaping")
        .env("DATABASE_URL", &env.url)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("reaping was not paused"));
    controller.stop().await;
}

/// Released sandboxes still waiting out their grace window are on their
/// way out: they do not dilute the burst of a truncate that follows. Five
/// released and five truncated is 5 of 5 lost rows, not 5 of 10 (which is
/// not more than half, and would let the truncated five be reaped).
#[tokio::test]
async fn sandboxes_released_just_before_a_truncate_do_not_hide_its_burst_from_the_breaker() {
    let env = TestEnv::new().await;
    let mut config = config(&env);
    // Long enough that the released five are still there at the truncate.
    config.grace = Duration::from_secs(120);
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let sandboxes = ready_sandboxes(&client, "dilute", 10).await;
    let (released, truncated) = sandboxes.split_at(5);
    for id in released {
        client.release(id).await.unwrap();
    }
    truncate_and_see_reaping_paused(&env, &controller).await;
    let reason: String = sqlx::query_scalar("SELECT reason FROM sandbox_reaping")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(reason.contains("5 of 5 sandboxes"), "{reason}");
    for id in released.iter().chain(truncated) {
        assert!(running(&env, id).await.is_some(), "{id} is still there");
    }
    controller.stop().await;
}
