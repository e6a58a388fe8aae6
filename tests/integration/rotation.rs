//! Rotation builds before it destroys, on the real Docker engine: a
//! rotation's new container is built next to the running one, which keeps
//! serving until the new one is ready and published; a rotation that
//! cannot succeed leaves the old container, its data and its credentials
//! working, and the status says why.

use crate::common;

use common::{eventually, exec_in, host_pg_url, request, sandbox_id, Agent, TestEnv};
use sandboxd::client::{Client, ClientError, Revision};
use sandboxd::config::Images;
use sandboxd::domain::container::ContainerState;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus};
use sqlx::{Connection, PgConnection};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

fn pg_url(s: &SandboxStatus) -> String {
    host_pg_url(&s.services["postgres"])
}

/// Whether `url` logs in (within a few seconds).
async fn logs_in(url: &str) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(url)).await,
        Ok(Ok(_))
    )
}

/// Creates a table holding one row through `url`.
async fn write_data(url: &str) {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query("CREATE TABLE kept (answer int)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO kept VALUES (42)")
        .execute(&mut conn)
        .await
        .unwrap();
}

/// The row written by [`write_data`], read through `url`.
async fn read_data(url: &str) -> i32 {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar("SELECT answer FROM kept")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

/// The sandbox's containers as (id, name, instance, running).
async fn containers(env: &TestEnv, id: &SandboxId) -> Vec<(String, String, String, bool)> {
    env.containers(Some(id))
        .await
        .into_iter()
        .map(|c| {
            (
                c.id.as_str().to_owned(),
                c.name,
                c.labels.instance,
                c.state == ContainerState::Running,
            )
        })
        .collect()
}

/// Waits for the status of `generation` to be `failed`, and returns it.
async fn failed_at(client: &Client, id: &SandboxId, generation: &Revision) -> SandboxStatus {
    match client.wait_ready(id, generation, READY).await {
        Err(ClientError::Failed { .. }) => {}
        other => panic!("expected a failed rotation, got {other:?}"),
    }
    // A failed rotation is retried with back-off, and the retry writes
    // `provisioning`: a read right after the waiter saw the failure can
    // find the retry under way. The failure is what the test inspects.
    eventually("the failed status", READY, || async {
        client
            .status(id)
            .await
            .ok()?
            .filter(|s| s.phase == Phase::Failed)
    })
    .await
}

#[tokio::test]
async fn asking_for_a_feature_the_image_lacks_leaves_the_old_container_data_and_credentials_working(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // The plain image ships pg_trgm but not postgis (its label says so).
    config.images = Images::new(
        &[common::test_images()],
        &["postgres=sandboxd/postgres:17".to_owned()],
    )
    .unwrap();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("lacks");
    let first = client
        .provision(
            &id,
            &request(&["postgres"], &[("postgres", "pg_trgm")]),
            READY,
        )
        .await
        .unwrap();
    write_data(&pg_url(&first)).await;
    let before = containers(&env, &id).await;
    assert_eq!(before.len(), 1);

    let generation = client
        .apply(
            &id,
            &request(
                &["postgres"],
                &[("postgres", "pg_trgm"), ("postgres", "postgis")],
            ),
        )
        .await
        .unwrap();
    let status = failed_at(&client, &id, &generation).await;
    for part in [
        "postgres",
        "postgis",
        "sandboxd/postgres:17",
        "nothing was changed",
    ] {
        assert!(status.message.contains(part), "{part}: {}", status.message);
    }
    assert!(
        status
            .message
            .contains("the running container keeps serving the published credentials"),
        "{}",
        status.message
    );
    assert_eq!(
        status.services["postgres"], first.services["postgres"],
        "the old credentials stay published"
    );
    assert_eq!(
        containers(&env, &id).await,
        before,
        "the old container is untouched"
    );
    assert_eq!(
        read_data(&pg_url(&first)).await,
        42,
        "its data and credentials work"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_new_container_that_is_not_ready_in_time_leaves_the_old_one_serving_and_a_later_rotation_succeeds(
) {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("slow");
    let controller = env.start(env.config());
    let first = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    write_data(&pg_url(&first)).await;
    let before = containers(&env, &id).await;
    controller.stop().await;

    // A controller whose Postgres readiness deadline no new container can
    // meet: the rotation's new container is created, then given up on.
    let mut impatient = env.config();
    let postgres = sandboxd::engine::lookup("postgres").unwrap().name();
    impatient
        .readiness
        .insert(postgres, Duration::from_millis(100));
    let controller = env.start(impatient);
    let generation = client
        .apply(&id, &request(&["postgres"], &[("postgres", "citext")]))
        .await
        .unwrap();
    let status = failed_at(&client, &id, &generation).await;
    for part in [
        "postgres",
        "did not become ready",
        "the rotation was abandoned",
    ] {
        assert!(status.message.contains(part), "{part}: {}", status.message);
    }
    assert_eq!(status.services["postgres"], first.services["postgres"]);
    assert_eq!(
        containers(&env, &id).await,
        before,
        "the new container was removed and the old one kept"
    );
    assert_eq!(read_data(&pg_url(&first)).await, 42);
    controller.stop().await;

    // With the usual deadline the same request rotates (the failed status
    // is retried at start).
    let controller = env.start(env.config());
    let rotated = eventually("the rotation retried and ready", READY, || async {
        let s = client.status(&id).await.unwrap()?;
        (s.phase == Phase::Ready && s.observed_generation >= generation.generation).then_some(s)
    })
    .await;
    assert_ne!(
        rotated.services["postgres"].instance,
        first.services["postgres"].instance
    );
    assert!(logs_in(&pg_url(&rotated)).await);
    assert!(
        !logs_in(&pg_url(&first)).await,
        "old credentials no longer work"
    );
    assert_eq!(containers(&env, &id).await.len(), 1);
    controller.stop().await;
}

#[tokio::test]
async fn a_rotation_keeps_the_old_container_serving_until_the_new_one_is_published() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let agent = Agent::start_from(&format!("agent-{}", env.deployment), "sandboxd/postgres:17");
    let id = sandbox_id("swap");
    let mut req = request(&["postgres"], &[]);
    req.attach = vec![agent.0.clone()];
    let first = client.provision(&id, &req, READY).await.unwrap();
    let old = first.services["postgres"].clone();
    let old_url = pg_url(&first);
    let [(_, canonical, _, _)] = containers(&env, &id).await.try_into().unwrap();

    // Log in with the old credentials over and over while the rotation
    // runs, each time reading the status afterwards.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (client, id, stop, old_url) =
            (client.clone(), id.clone(), stop.clone(), old_url.clone());
        async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let ok = logs_in(&old_url).await;
                let s = client.status(&id).await.unwrap().unwrap();
                samples.push((ok, s.phase, s.services["postgres"].instance.clone()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            samples
        }
    });
    req = request(&["postgres"], &[("postgres", "uuid-ossp")]);
    req.attach = vec![agent.0.clone()];
    let rotated = client.provision(&id, &req, READY).await.unwrap();
    stop.store(true, Ordering::Release);
    let samples = sampler.await.unwrap();

    let new = &rotated.services["postgres"];
    assert_ne!(new.instance, old.instance);
    assert!(
        samples.iter().any(|(ok, phase, instance)| *ok
            && *phase == Phase::Provisioning
            && *instance == old.instance),
        "the old container served while the new one was built: {samples:?}"
    );
    assert!(
        samples
            .iter()
            .any(|(_, _, instance)| *instance == new.instance),
        "the switch happened while sampling: {samples:?}"
    );
    for (ok, phase, instance) in &samples {
        assert!(
            *ok || *instance != old.instance,
            "the old credentials failed while the status still published them ({phase}): {samples:?}"
        );
    }

    // Exactly one container is left: the new one, under the engine's name.
    let left = containers(&env, &id).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1, canonical, "it took the engine's container name");
    assert_eq!(left[0].2, new.instance);
    assert!(
        !logs_in(&old_url).await,
        "the old credentials no longer work"
    );
    let mut conn = PgConnection::connect(&pg_url(&rotated)).await.unwrap();
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'uuid-ossp'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(n, 1);

    // On the sandbox network the engine's name now reaches the new one.
    let script = format!(
        "PGPASSWORD=\"$P\" psql -X -At -h {} -p {} -U {} -d {} -c 'SELECT 40 + 2'",
        new.host, new.port, new.user, new.database
    );
    let (code, out) = exec_in(
        &env,
        &agent.0,
        &script,
        vec![format!("P={}", new.password.expose())],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "42"), "{out}");
    controller.stop().await;
}

#[tokio::test]
async fn a_published_new_container_left_under_its_temporary_name_is_switched_to_after_a_restart() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("finish");
    let controller = env.start(env.config());
    client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let rotated = client
        .provision(
            &id,
            &request(&["postgres"], &[("postgres", "citext")]),
            READY,
        )
        .await
        .unwrap();
    controller.stop().await;

    // Put the published container back where a controller killed right
    // after publishing it would have left it: under its temporary name,
    // without the engine's alias on the sandbox network.
    let [(container, canonical, _, _)] = containers(&env, &id).await.try_into().unwrap();
    let temporary = format!("{canonical}.next-test");
    let network = rotated.network.clone().expect("a sandbox network");
    for args in [
        vec!["rename", &container, &temporary],
        vec!["network", "disconnect", &network, &container],
        vec!["network", "connect", &network, &container],
    ] {
        let out = std::process::Command::new("docker")
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let controller = env.start(env.config());
    let status = eventually("the switch finished and published", READY, || async {
        let left = env.containers(Some(&id)).await;
        let s = client.status(&id).await.unwrap()?;
        let [c] = left.as_slice() else {
            return None;
        };
        (c.name == canonical
            && s.phase == Phase::Ready
            && c.host_port == Some(s.services["postgres"].host_port))
        .then_some(s)
    })
    .await;
    let pg = &status.services["postgres"];
    assert_eq!(
        pg.password, rotated.services["postgres"].password,
        "the published credentials stay"
    );
    assert_eq!(
        containers(&env, &id).await[0].0,
        container,
        "the same container"
    );
    assert!(
        logs_in(&pg_url(&status)).await,
        "on the host port it was bound to anew"
    );
    let aliases = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            &format!("{{{{json (index .NetworkSettings.Networks \"{network}\").Aliases}}}}"),
            &container,
        ])
        .output()
        .unwrap();
    let aliases = String::from_utf8_lossy(&aliases.stdout);
    assert!(aliases.contains("\"postgres\""), "{aliases}");
    controller.stop().await;
}

#[tokio::test]
async fn a_persistent_sandboxs_failed_rotation_restores_its_old_credentials_and_keeps_its_data() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // An image that is no sandboxd engine image (no sandbox-mode label):
    // Docker refuses the new container, after the old one went (one data
    // volume holds one server at a time).
    config.images = Images::new(
        &[common::test_images()],
        &["postgres=sandboxd/debian-base:trixie".to_owned()],
    )
    .unwrap();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("keep");
    let mut req = request(&["postgres"], &[]);
    req.persistent = true;
    let first = client.provision(&id, &req, READY).await.unwrap();
    write_data(&pg_url(&first)).await;

    let mut req = request(&["postgres"], &[("postgres", "citext")]);
    req.persistent = true;
    let generation = client.apply(&id, &req).await.unwrap();
    let status = failed_at(&client, &id, &generation).await;
    for part in ["sandbox-mode", "the rotation was rolled back"] {
        assert!(status.message.contains(part), "{part}: {}", status.message);
    }
    let pg = &status.services["postgres"];
    assert_eq!(
        pg.password, first.services["postgres"].password,
        "the old credentials"
    );
    let left = containers(&env, &id).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        left[0].2, pg.instance,
        "the restored container is published"
    );
    assert_eq!(
        read_data(&pg_url(&status)).await,
        42,
        "its data and credentials work"
    );
    controller.stop().await;
}
