//! Every wait has an end: a lock held on the state database times the
//! controller's statements out on the server, and progress resumes once
//! the lock is gone; a frozen engine container makes its readiness probe
//! give up at its deadline (real Docker, real Postgres).

use crate::common;

use common::{eventually, host_pg_url, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::config::readiness_overrides;
use sandboxd::domain::Phase;
use sandboxd::ports::runtime::Containers;
use sqlx::Connection;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_lock_held_on_sandbox_status_times_statements_out_on_the_server_and_progress_resumes_after(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.store_timeout = Duration::from_secs(2);
    let controller = env.start_bounded(config).await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("locked");

    // Someone holds an exclusive lock on the status table.
    let mut lock = env.admin_pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE sandbox_status IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let revision = client.apply(&id, &request(&["redis"], &[])).await.unwrap();

    // The controller keeps trying, but none of its sessions waits on the
    // lock for longer than its lock timeout (1 s): the server cancels them.
    // (Sessions of this test's database: other tests share the server.)
    let mut waited = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(750)).await;
        let stuck: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND usename = 'sandboxd'
               AND wait_event_type = 'Lock'
               AND now() - query_start > interval '1.8 seconds'",
        )
        .fetch_one(&env.admin_pool)
        .await
        .unwrap();
        assert_eq!(stuck, 0, "a session waited on the lock past its timeout");
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND usename = 'sandboxd'
               AND wait_event_type = 'Lock'",
        )
        .fetch_one(&env.admin_pool)
        .await
        .unwrap();
        waited += waiting;
    }
    assert!(waited > 0, "the controller never even reached the lock");
    lock.rollback().await.unwrap();

    // Progress resumes: the sandbox becomes ready.
    let status = client
        .wait_ready(&id, &revision, Duration::from_secs(60))
        .await
        .expect("ready once the lock is gone");
    assert_eq!(status.phase, Phase::Ready);
    controller.stop().await;
}

/// Whether the Postgres container `id` has read its secrets and is
/// initialising its cluster (its entrypoint logs that after standard input).
async fn initialising(docker: &bollard::Docker, id: &str) -> bool {
    use futures::StreamExt;
    let options = bollard::query_parameters::LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .build();
    let mut logs = docker.logs(id, Some(options));
    let mut text = String::new();
    while let Some(Ok(chunk)) = logs.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    text.contains("initialising database cluster")
}

/// How long the provisioner said it waited, from a "did not become ready
/// within …" message.
fn waited(message: &str) -> Option<Duration> {
    let rest = message.split("did not become ready within ").nth(1)?;
    let secs: f64 = rest.split("s (").next()?.parse().ok()?;
    Some(Duration::from_secs_f64(secs))
}

#[tokio::test]
async fn a_paused_engine_container_makes_its_readiness_probe_give_up_by_its_deadline_while_other_sandboxes_converge(
) {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // One worker: the other sandbox is served only once the stuck
    // provisioning has given up.
    config.concurrency = 1;
    let deadline = Duration::from_secs(6);
    config.readiness = readiness_overrides(&[("postgres".into(), deadline)]).unwrap();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let paused = sandbox_id("paused");
    let other = sandbox_id("other");

    // Every container of `paused` is frozen (`docker pause`) once it has
    // read its secrets and started initdb (its log says so), before
    // Postgres can answer, until the test says stop.
    let pausing = Arc::new(AtomicBool::new(true));
    let first_pause = Arc::new(tokio::sync::Notify::new());
    let pauser = tokio::spawn({
        let (runtime, docker, deployment) = (
            env.runtime.clone(),
            env.docker.clone(),
            env.deployment.clone(),
        );
        let (pausing, first_pause, id) = (pausing.clone(), first_pause.clone(), paused.clone());
        async move {
            let mut done = HashSet::new();
            while pausing.load(Ordering::Acquire) {
                for c in runtime
                    .list(&deployment, Some(&id))
                    .await
                    .unwrap_or_default()
                {
                    if done.contains(&c.id) || !initialising(&docker, c.id.as_str()).await {
                        continue;
                    }
                    if docker.pause_container(c.id.as_str()).await.is_ok() {
                        done.insert(c.id);
                        first_pause.notify_one();
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let generation = client
        .apply(&paused, &request(&["postgres"], &[]))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), first_pause.notified())
        .await
        .expect("the first container of the sandbox was paused");
    let other_generation = client
        .apply(&other, &request(&["redis"], &[]))
        .await
        .unwrap();

    // The probe of the frozen engine gives up at its deadline: the sandbox
    // is failed with that reason, and the freed worker serves the other.
    let message = eventually(
        "the paused sandbox fails",
        Duration::from_secs(60),
        || async {
            client
                .status(&paused)
                .await
                .unwrap()
                .filter(|s| s.phase == Phase::Failed)
                .map(|s| s.message)
        },
    )
    .await;
    let gave_up_after = waited(&message).unwrap_or_else(|| panic!("{message}"));
    assert!(
        gave_up_after >= deadline && gave_up_after < deadline + Duration::from_secs(1),
        "the probe gave up {gave_up_after:?} into a {deadline:?} deadline: {message}"
    );
    let status = client
        .wait_ready(&other, &other_generation, Duration::from_secs(60))
        .await
        .expect("the other sandbox converges meanwhile");
    assert_eq!(status.phase, Phase::Ready);
    let metrics = controller.metrics.render();
    assert!(
        metrics.contains("sandboxd_reconcile_timeouts_total 0"),
        "the probe's own deadline ended the wait, not the reconcile's:\n{metrics}"
    );

    // Thawed, the sandbox becomes ready and its credentials log in. The
    // controller is started again with the default deadline: 6 s is less
    // than a cold Postgres start takes on a loaded machine (10-16 s in
    // CI's first pass, where every retry then gave up again), and the
    // retries frozen meanwhile have pushed the backoff out.
    pausing.store(false, Ordering::Release);
    pauser.await.unwrap();
    for c in env.containers(Some(&paused)).await {
        let _ = env.docker.unpause_container(c.id.as_str()).await;
    }
    controller.stop().await;
    let controller = env.start(env.config());
    // (What it last said is kept: a wait that times out shows it.)
    let last = std::sync::Mutex::new(None);
    let thawed = tokio::time::timeout(
        Duration::from_secs(120),
        eventually(
            "the thawed sandbox is ready",
            Duration::from_secs(3600),
            || async {
                let s = client.status(&paused).await.unwrap();
                *last.lock().unwrap() = s.clone().map(|s| (s.phase, s.message));
                s.filter(|s| {
                    s.phase == Phase::Ready && s.observed_generation >= generation.generation
                })
            },
        ),
    )
    .await;
    let status = thawed.unwrap_or_else(|_| {
        let last = last.lock().unwrap().clone();
        panic!("the thawed sandbox is not ready after 120 s; its last status: {last:?}")
    });
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("the published credentials log in");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    controller.stop().await;
}

#[tokio::test]
async fn an_image_being_built_holds_no_worker_slot_and_two_sandboxes_waiting_for_it_cause_one_pull_and_one_build(
) {
    let env = TestEnv::new().await;
    // No registry answers (port 9 refuses at once), so the pull fails and
    // the build command makes the image: it waits for the test's go, then
    // tags the local Redis image under the missing name.
    let image = format!("127.0.0.1:9/sandboxd/slow-build:{}", env.deployment);
    let gate = std::env::temp_dir().join(format!("sandboxd-build-gate-{}", env.deployment));
    let mut config = env.config();
    config.concurrency = 1;
    config.images = sandboxd::config::Images::new(&[format!("redis={image}")], &[]).unwrap();
    config.image_build_command = Some(format!(
        r#"while [ ! -e '{}' ]; do sleep 0.1; done; docker tag sandboxd/redis:8 "$1""#,
        gate.display()
    ));
    config.build_timeout = Duration::from_secs(120);
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let waiting: Vec<_> = (0..2).map(|_| sandbox_id("built")).collect();
    let mut generations = Vec::new();
    for id in &waiting {
        generations.push(client.apply(id, &request(&["redis"], &[])).await.unwrap());
    }
    for id in &waiting {
        let status = eventually(
            "it waits for the build",
            Duration::from_secs(60),
            || async {
                client.status(id).await.unwrap().filter(|s| {
                    s.phase == Phase::Provisioning
                        && s.message.contains("being built by --image-build-command")
                })
            },
        )
        .await;
        assert!(status.message.contains(&image), "{}", status.message);
    }

    // The one worker serves a sandbox on a present image meanwhile.
    let other = sandbox_id("other");
    let generation = client
        .apply(&other, &request(&["postgres"], &[]))
        .await
        .unwrap();
    let status = client
        .wait_ready(&other, &generation, Duration::from_secs(60))
        .await
        .expect("ready while the build runs");
    assert_eq!(status.phase, Phase::Ready);
    for id in &waiting {
        let status = client.status(id).await.unwrap().unwrap();
        assert_eq!(status.phase, Phase::Provisioning, "{}", status.message);
    }

    // The build ends: both become ready on the built image.
    std::fs::write(&gate, b"go").unwrap();
    for (id, generation) in waiting.iter().zip(generations) {
        let status = client
            .wait_ready(id, &generation, Duration::from_secs(60))
            .await
            .expect("ready once the image is built");
        assert_eq!(status.phase, Phase::Ready);
    }
    let metrics = controller.metrics.render();
    for line in [
        "sandboxd_image_pulls_total{result=\"error\"} 1",
        "sandboxd_image_builds_total{result=\"success\"} 1",
        "sandboxd_image_fetches 0",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    controller.stop().await;
    drop(env);
    let _ = std::fs::remove_file(&gate);
    let _ = std::process::Command::new("docker")
        .args(["rmi", &image])
        .output();
}
