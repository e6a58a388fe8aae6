//! The controller converges whatever happens to containers, rows or the
//! controller itself: self-heal, rotation, grace-window reaping, scope and
//! restart safety, on the real Docker engine.

use crate::common;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptions, RemoveContainerOptionsBuilder,
};
use common::{eventually, free_port, host_pg_url, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::container::{ContainerState, ObservedContainer};
use sandboxd::domain::SandboxId;
use sandboxd::domain::{Phase, SandboxStatus};
use sqlx::Connection;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

fn pg_url(s: &SandboxStatus) -> String {
    host_pg_url(&s.services["postgres"])
}

async fn engine_container(
    env: &TestEnv,
    id: &SandboxId,
    engine: &str,
) -> Option<ObservedContainer> {
    env.containers(Some(id))
        .await
        .into_iter()
        .find(|c| c.labels.engine == engine && c.state == ContainerState::Running)
}

/// A configuration whose periodic relist is too slow to matter, so a heal
/// within the test's timeout proves the Docker event stream drove it.
fn events_only(env: &TestEnv) -> sandboxd::config::ControllerConfig {
    let mut config = env.config();
    config.relist_interval = Duration::from_secs(3600);
    config
}

/// Waits until `engine` runs in a container other than `old` and the
/// status is ready again.
async fn wait_replaced(
    env: &TestEnv,
    client: &Client,
    id: &SandboxId,
    engine: &str,
    old: &str,
    within: Duration,
) -> SandboxStatus {
    eventually(
        "a replacement container and a ready status",
        within,
        || async {
            let c = engine_container(env, id, engine).await?;
            let s = client.status(id).await.unwrap()?;
            (c.id.as_str() != old
                && s.phase == Phase::Ready
                && s.services[engine].instance == c.labels.instance)
                .then_some(s)
        },
    )
    .await
}

#[tokio::test]
async fn a_killed_container_is_healed_with_the_same_credentials_and_endpoint() {
    let env = TestEnv::new().await;
    let controller = env.start(events_only(&env));
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("kill");
    let before = client
        .provision(&id, &request(&["postgres", "redis"], &[]), READY)
        .await
        .unwrap();
    let victim = engine_container(&env, &id, "postgres").await.unwrap();
    let redis_before = engine_container(&env, &id, "redis").await.unwrap();

    env.docker
        .kill_container(victim.id.as_str(), None::<KillContainerOptions>)
        .await
        .unwrap();
    let after = wait_replaced(
        &env,
        &client,
        &id,
        "postgres",
        victim.id.as_str(),
        Duration::from_secs(20),
    )
    .await;

    assert_eq!(
        after.services["postgres"].password,
        before.services["postgres"].password
    );
    assert_eq!(
        after.services["postgres"].host_port,
        before.services["postgres"].host_port
    );
    assert_eq!(
        after.services["postgres"].host,
        before.services["postgres"].host
    );
    // A client that reconnects with what it already had succeeds.
    let mut conn = sqlx::PgConnection::connect(&pg_url(&before))
        .await
        .expect("reconnect with old credentials");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    // The other engine was not touched.
    assert_eq!(
        engine_container(&env, &id, "redis").await.unwrap().id,
        redis_before.id
    );
    // Exactly one container per engine.
    assert_eq!(env.containers(Some(&id)).await.len(), 2);
    controller.stop().await;
}

#[tokio::test]
async fn a_container_removed_out_of_band_is_healed_with_the_same_credentials() {
    let env = TestEnv::new().await;
    let controller = env.start(events_only(&env));
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("rm");
    let before = client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let victim = engine_container(&env, &id, "redis").await.unwrap();

    let force = RemoveContainerOptionsBuilder::default().force(true).build();
    env.docker
        .remove_container(victim.id.as_str(), Some(force))
        .await
        .unwrap();
    let after = wait_replaced(
        &env,
        &client,
        &id,
        "redis",
        victim.id.as_str(),
        Duration::from_secs(20),
    )
    .await;

    let (old, new) = (&before.services["redis"], &after.services["redis"]);
    assert_eq!(new.password, old.password);
    assert_eq!(new.host_port, old.host_port);
    let c = redis::Client::open(format!(
        "redis://:{}@127.0.0.1:{}/0",
        old.password.expose(),
        old.host_port
    ))
    .unwrap();
    let mut con = c
        .get_multiplexed_async_connection()
        .await
        .expect("reconnect with old credentials");
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    controller.stop().await;
}

/// `docker rm -f` answers before Docker has removed the container, which
/// keeps its name until then: the heal (driven by the `kill`/`die` events
/// at once) meets the name still held and waits for the removal, instead
/// of failing the reconcile into back-off.
#[tokio::test]
async fn a_container_force_removed_again_and_again_is_healed_each_time_without_a_reconcile_error() {
    let env = TestEnv::new().await;
    let controller = env.start(events_only(&env));
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("rmf");
    let before = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let force = RemoveContainerOptionsBuilder::default().force(true).build();
    for round in 1..=3 {
        let victim = engine_container(&env, &id, "postgres").await.unwrap();
        env.docker
            .remove_container(victim.id.as_str(), Some(force.clone()))
            .await
            .unwrap();
        // A removal from outside is healed at once, every time (no
        // crash-loop back-off): the bound is the removal and a cold start.
        let after = wait_replaced(
            &env,
            &client,
            &id,
            "postgres",
            victim.id.as_str(),
            Duration::from_secs(20),
        )
        .await;
        let (old, new) = (&before.services["postgres"], &after.services["postgres"]);
        assert_eq!(new.password, old.password, "round {round}");
        let mut conn = sqlx::PgConnection::connect(&pg_url(&after))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the old credentials work: {e}"));
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(one, 1);
    }
    // The events are written after the status: the third heal's may lag.
    let events = eventually("an event per heal", Duration::from_secs(10), || async {
        let events = client.events(&id, 100).await.unwrap();
        let heals: i32 = events
            .iter()
            .filter(|e| e.reason == "healed")
            .map(|e| e.count)
            .sum();
        (heals >= 3).then_some(events)
    })
    .await;
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "reconcile_failed")
        .collect();
    assert!(failed.is_empty(), "no reconcile failed: {failed:#?}");
    let errors = common::sample(
        &controller.metrics.render(),
        "controller_runtime_reconcile_errors_total{controller=\"sandbox\"}",
    )
    .expect("the reconcile error counter");
    assert_eq!(errors, 0.0, "no reconcile error at all");
    assert_eq!(env.containers(Some(&id)).await.len(), 1);
    controller.stop().await;
}

/// On the real engine: a create whose name is still held by a container
/// Docker is removing is told as `NameBeingRemoved`, naming that
/// container (what the controller waits out), and succeeds once the
/// removal is done.
#[tokio::test]
async fn a_create_meeting_its_name_held_by_a_container_being_removed_names_it_and_succeeds_after() {
    use bollard::models::ContainerStateStatusEnum;
    use bollard::query_parameters::InspectContainerOptions;
    use sandboxd::ports::runtime::{ContainerSpec, Containers, RuntimeError};
    let env = TestEnv::new().await;
    let id = sandbox_id("held");
    let name = format!("sandboxd.{}.{id}.redis", env.deployment);
    // A sandbox container's labels (sandboxd's own, as `ContainerLabels` writes them).
    let labels: HashMap<String, String> = [
        ("io.sandboxd.managed-by", "sandboxd"),
        ("io.sandboxd.deployment", env.deployment.as_str()),
        ("io.sandboxd.sandbox", id.as_str()),
        ("io.sandboxd.owner", "test"),
        ("io.sandboxd.engine", "redis"),
        ("io.sandboxd.generation", "0"),
        ("io.sandboxd.features", ""),
        ("io.sandboxd.instance", "i1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let spec = ContainerSpec {
        name: name.clone(),
        image: "sandboxd/redis:8".into(),
        env: Vec::new(),
        cmd: Vec::new(),
        entrypoint: Some(vec!["sleep".into(), "600".into()]),
        labels: labels.clone(),
        port: 6379,
        host_port: None,
        network: "bridge".into(),
        aliases: Vec::new(),
        user: "999:999".into(),
        limits: Default::default(),
        tmpfs: Vec::new(),
        volume: None,
        template: None,
        start_from: None,
        binaries: None,
        stdin: None,
        image_label: None,
        runtime: None,
    };
    // The removal can finish before the create looks (it takes a few
    // hundred ms here, less on an idle host): tried until the create meets
    // the name held, which must happen within a few tries.
    let mut met = false;
    for _ in 0..8 {
        let holder = env.runtime.create_and_start(&spec).await.unwrap();
        // `docker rm -f` in the background; the create as soon as Docker
        // says the holder is being removed.
        let docker = env.docker.clone();
        let victim = holder.as_str().to_owned();
        let removal = tokio::spawn(async move {
            let force = RemoveContainerOptionsBuilder::default().force(true).build();
            docker.remove_container(&victim, Some(force)).await
        });
        eventually(
            "the holder being removed",
            Duration::from_secs(10),
            || async {
                let info = env
                    .docker
                    .inspect_container(holder.as_str(), None::<InspectContainerOptions>)
                    .await;
                match info {
                    // Already gone: the removal won the race.
                    Err(_) => Some(()),
                    Ok(info) => {
                        (info.state?.status? == ContainerStateStatusEnum::REMOVING).then_some(())
                    }
                }
            },
        )
        .await;
        match env.runtime.create_and_start(&spec).await {
            Err(RuntimeError::NameBeingRemoved { name: n, holder: h }) => {
                assert_eq!((n.as_str(), h.as_str()), (name.as_str(), holder.as_str()));
                met = true;
            }
            Ok(created) => {
                // The removal finished first: the name was free.
                removal.await.unwrap().unwrap();
                env.runtime.remove(&created, Duration::ZERO).await.unwrap();
                continue;
            }
            other => panic!("a name held by a container being removed: {other:?}"),
        }
        removal.await.unwrap().unwrap();
        let created = env
            .runtime
            .create_and_start(&spec)
            .await
            .expect("the name is free once the removal is done");
        assert_ne!(created, holder);
        env.runtime.remove(&created, Duration::ZERO).await.unwrap();
        break;
    }
    assert!(
        met,
        "the create never met the name held by a container being removed"
    );
}

#[tokio::test]
async fn a_feature_superset_rotates_credentials_and_a_subset_changes_nothing() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("rot");
    let first = client
        .provision(
            &id,
            &request(
                &["postgres"],
                &[("postgres", "pg_trgm"), ("postgres", "citext")],
            ),
            READY,
        )
        .await
        .unwrap();
    let first_container = engine_container(&env, &id, "postgres").await.unwrap();

    // Subset: a new generation, nothing else changes.
    let subset = client
        .provision(
            &id,
            &request(&["postgres"], &[("postgres", "pg_trgm")]),
            READY,
        )
        .await
        .unwrap();
    assert_eq!(subset.observed_generation, 2);
    assert_eq!(
        subset.services["postgres"].password,
        first.services["postgres"].password
    );
    assert_eq!(
        engine_container(&env, &id, "postgres").await.unwrap().id,
        first_container.id
    );

    // Superset: the union, fresh credentials.
    let superset = client
        .provision(
            &id,
            &request(
                &["postgres"],
                &[("postgres", "pg_trgm"), ("postgres", "uuid-ossp")],
            ),
            READY,
        )
        .await
        .unwrap();
    assert_eq!(superset.observed_generation, 3);
    let pg = &superset.services["postgres"];
    assert_ne!(
        pg.password, first.services["postgres"].password,
        "rotation gives fresh credentials"
    );
    for ext in ["citext", "pg_trgm", "uuid-ossp"] {
        assert!(
            pg.available_extensions.iter().any(|e| e == ext),
            "{ext} in {:?}",
            pg.available_extensions
        );
    }
    let mut conn = sqlx::PgConnection::connect(&pg_url(&superset))
        .await
        .unwrap();
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'uuid-ossp'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(n, 1);
    assert!(
        sqlx::PgConnection::connect(&pg_url(&first)).await.is_err(),
        "old credentials no longer work"
    );
    assert_eq!(env.containers(Some(&id)).await.len(), 1);
    controller.stop().await;
}

#[tokio::test]
async fn adding_a_service_adds_only_that_engine_and_dropping_one_removes_only_it() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("add");
    let first = client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let redis_container = engine_container(&env, &id, "redis").await.unwrap();

    let both = client
        .provision(&id, &request(&["redis", "postgres"], &[]), READY)
        .await
        .unwrap();
    assert_eq!(
        both.services["redis"].password,
        first.services["redis"].password
    );
    assert_eq!(
        engine_container(&env, &id, "redis").await.unwrap().id,
        redis_container.id
    );
    assert!(both.services.contains_key("postgres"));

    let only_pg = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    assert!(!only_pg.services.contains_key("redis"));
    eventually(
        "the redis container is reaped",
        Duration::from_secs(30),
        || async {
            engine_container(&env, &id, "redis")
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        only_pg.services["postgres"].password,
        both.services["postgres"].password
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_deleted_young_sandbox_is_reaped_only_after_the_grace_window() {
    let env = TestEnv::new().await;
    let grace = Duration::from_secs(6);
    let mut config = env.config();
    config.grace = grace;
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("grace");
    client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    let container = engine_container(&env, &id, "redis").await.unwrap();
    client.release(&id).await.unwrap();

    let terminating = eventually("phase terminating", Duration::from_secs(10), || async {
        client
            .status(&id)
            .await
            .unwrap()
            .filter(|s| s.phase == Phase::Terminating)
    })
    .await;
    assert!(
        terminating.message.contains("grace"),
        "{}",
        terminating.message
    );
    let age = chrono::Utc::now() - container.created;
    assert!(
        age < chrono::Duration::from_std(grace).unwrap() - chrono::Duration::seconds(2),
        "test too slow to observe the wait"
    );
    assert!(
        engine_container(&env, &id, "redis").await.is_some(),
        "a young container waits for the grace window"
    );

    eventually(
        "the container and the status are gone",
        Duration::from_secs(30),
        || async {
            (env.containers(Some(&id)).await.is_empty()
                && client.status(&id).await.unwrap().is_none())
            .then_some(())
        },
    )
    .await;
    let reaped_at = chrono::Utc::now();
    assert!(reaped_at - container.created >= chrono::Duration::from_std(grace).unwrap());
    controller.stop().await;
}

#[tokio::test]
async fn an_expired_row_is_torn_down_and_reported_terminating() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("exp");
    client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE sandbox_desired SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(id.as_str())
    .execute(&env.pool)
    .await
    .unwrap();
    let s = eventually(
        "expired sandbox torn down",
        Duration::from_secs(30),
        || async {
            let s = client.status(&id).await.unwrap()?;
            (s.phase == Phase::Terminating && env.containers(Some(&id)).await.is_empty())
                .then_some(s)
        },
    )
    .await;
    assert!(s.message.contains("expired"), "{}", s.message);
    assert!(
        s.services.is_empty(),
        "no credentials are published for a torn-down sandbox"
    );
    controller.stop().await;
}

#[tokio::test]
async fn containers_of_another_deployment_or_without_labels_are_never_touched() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.relist_interval = Duration::from_millis(500);
    // Look-alikes: another deployment's sandbox (whose row this database
    // does not have) and an unlabelled container with a sandbox-like name.
    let mut ids = Vec::new();
    for (name, labels) in [
        (
            format!("sandboxd-other-{}-redis", env.deployment),
            HashMap::from([
                ("io.sandboxd.managed-by".to_string(), "sandboxd".to_string()),
                (
                    "io.sandboxd.deployment".to_string(),
                    format!("{}-other", env.deployment),
                ),
                ("io.sandboxd.sandbox".to_string(), "orphan".to_string()),
                ("io.sandboxd.engine".to_string(), "redis".to_string()),
                ("io.sandboxd.generation".to_string(), "1".to_string()),
                ("io.sandboxd.features".to_string(), String::new()),
            ]),
        ),
        (
            format!("sandboxd.{}.orphan.redis", env.deployment),
            HashMap::new(),
        ),
    ] {
        let body = ContainerCreateBody {
            image: Some("sandboxd/redis:8".into()),
            labels: Some(labels),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = env
            .docker
            .create_container(Some(options), body)
            .await
            .unwrap();
        env.docker.start_container(&created.id, None).await.unwrap();
        ids.push((name, created.id));
    }
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    // Our own sandbox converges meanwhile, so the controller is demonstrably working.
    let id = sandbox_id("mine");
    client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // several relists with grace 0

    for (name, cid) in &ids {
        let info = env
            .docker
            .inspect_container(cid, None)
            .await
            .expect("still exists");
        assert_eq!(
            info.state.and_then(|s| s.running),
            Some(true),
            "{name} still running"
        );
    }
    controller.stop().await;
    for (_, cid) in ids {
        let force = RemoveContainerOptionsBuilder::default().force(true).build();
        env.docker
            .remove_container(&cid, Some(force))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn restarting_the_controller_while_sandboxes_are_ready_changes_no_credentials() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("restart");
    let before = client
        .provision(
            &id,
            &request(&["postgres", "redis"], &[("redis", "search")]),
            READY,
        )
        .await
        .unwrap();
    let containers_before: BTreeSet<String> = env
        .containers(Some(&id))
        .await
        .into_iter()
        .map(|c| c.id.as_str().to_owned())
        .collect();
    controller.stop().await;

    let controller = env.start(env.config());
    eventually(
        "the new controller is ready",
        Duration::from_secs(10),
        || async { controller.readiness.is_ready().then_some(()) },
    )
    .await;
    // Give it time to reconcile everything it listed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = client.status(&id).await.unwrap().unwrap();
    assert_eq!(after.phase, Phase::Ready);
    for engine in ["postgres", "redis"] {
        assert_eq!(
            after.services[engine].password, before.services[engine].password,
            "{engine}"
        );
        assert_eq!(
            after.services[engine].host_port, before.services[engine].host_port,
            "{engine}"
        );
    }
    let containers_after: BTreeSet<String> = env
        .containers(Some(&id))
        .await
        .into_iter()
        .map(|c| c.id.as_str().to_owned())
        .collect();
    assert_eq!(
        containers_after, containers_before,
        "no container was recreated"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_controller_killed_mid_provision_and_restarted_converges_to_one_container_per_engine() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("sigkill");
    let port = free_port();
    let first = env.spawn_binary(port, &[]);
    // postgis makes provisioning long enough to be caught in the middle.
    let revision = client
        .apply(
            &id,
            &request(
                &["postgres", "redis"],
                &[("postgres", "postgis"), ("redis", "search")],
            ),
        )
        .await
        .unwrap();
    eventually(
        "provisioning has started",
        Duration::from_secs(30),
        || async {
            let s = client.status(&id).await.unwrap()?;
            let started = !env.containers(Some(&id)).await.is_empty();
            (s.phase == Phase::Provisioning && started).then_some(())
        },
    )
    .await;
    first.signal("KILL");
    drop(first);

    let _second = env.spawn_binary(port, &[]);
    let status = client
        .wait_ready(&id, &revision, READY)
        .await
        .expect("converges after the restart");
    let containers = env.containers(Some(&id)).await;
    let engines: Vec<&str> = containers
        .iter()
        .map(|c| c.labels.engine.as_str())
        .collect();
    assert_eq!(
        containers.len(),
        2,
        "exactly one container per engine: {engines:?}"
    );
    assert!(containers
        .iter()
        .all(|c| c.state == ContainerState::Running));
    let mut conn = sqlx::PgConnection::connect(&pg_url(&status))
        .await
        .expect("published credentials work");
    let postgis: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'postgis'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(postgis, 1);
}

#[tokio::test]
async fn a_container_killed_from_outside_every_second_is_healed_every_time_with_its_credentials() {
    let env = TestEnv::new().await;
    let mut config = events_only(&env);
    // A back-off this short would show within the run if kills counted.
    config.crash_loop = sandboxd::domain::crash_loop::CrashLoopPolicy {
        base: Duration::from_secs(2),
        cap: Duration::from_secs(30),
        window: Duration::from_secs(120),
    };
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("killed");
    let before = client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();

    // Killed every second, whether its heal finished or not; the kills of
    // a ready container each need a heal of their own. Until eight kills
    // landed, five of them on a ready container (a loaded machine heals
    // slower than a kill a second, so that may take more than ten).
    let (mut kills, mut of_ready) = (0u32, 0u32);
    for _ in 0..40 {
        if kills >= 8 && of_ready >= 5 {
            break;
        }
        let ready = client.status(&id).await.unwrap().unwrap().phase == Phase::Ready;
        if let Some(c) = engine_container(&env, &id, "redis").await {
            let killed = env
                .docker
                .kill_container(c.id.as_str(), None::<KillContainerOptions>)
                .await
                .is_ok();
            kills += u32::from(killed);
            of_ready += u32::from(killed && ready);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = client.status(&id).await.unwrap().unwrap();
        assert_ne!(s.phase, Phase::Failed, "{s:?}");
        assert!(
            !s.message.contains("crash loop"),
            "a kill is no crash: {s:?}"
        );
    }
    assert!(
        kills >= 8 && of_ready >= 5,
        "{kills} kills landed, {of_ready} of a ready container"
    );
    let after = eventually(
        "healed after the last kill",
        Duration::from_secs(10),
        || async {
            let s = client.status(&id).await.unwrap()?;
            (s.phase == Phase::Ready && s.services["redis"].heals >= of_ready).then_some(s)
        },
    )
    .await;
    assert_eq!(
        after.services["redis"].password,
        before.services["redis"].password
    );
    assert_eq!(
        after.services["redis"].host_port,
        before.services["redis"].host_port
    );
    controller.stop().await;
}

#[tokio::test]
async fn an_engine_that_exits_on_its_own_at_start_backs_off_to_the_cap_and_keeps_trying() {
    let env = TestEnv::new().await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("crashloop");
    let controller = env.start(env.config());
    let before = client
        .provision(&id, &request(&["redis"], &[]), READY)
        .await
        .unwrap();
    controller.stop().await;

    // The same deployment, now with a Redis image whose process exits at
    // once (Postgres's image, given Redis's arguments): every heal starts
    // a container that dies on its own before it is ready.
    let mut broken = env.config();
    broken.images = sandboxd::config::Images::new(
        &["postgres=sandboxd/postgres:17,redis=sandboxd/postgres:17".to_owned()],
        &[],
    )
    .unwrap();
    broken.crash_loop = sandboxd::domain::crash_loop::CrashLoopPolicy {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(2),
        window: Duration::from_secs(300),
    };
    let controller = env.start(broken);
    let victim = engine_container(&env, &id, "redis").await.expect("running");
    env.docker
        .kill_container(victim.id.as_str(), None::<KillContainerOptions>)
        .await
        .unwrap();

    // Heals wait 0.5, 1, 2, 2, 2 ... s: past the cap within ~10 s, and on.
    let deaths = |s: &SandboxStatus| -> Option<u32> {
        let m = &s.message;
        let at = m.find("died on its own ")? + "died on its own ".len();
        m[at..].split(' ').next()?.parse().ok()
    };
    let started = std::time::Instant::now();
    let mut most = 0;
    let mut at_cap = None;
    while started.elapsed() < Duration::from_secs(40) {
        let s = client.status(&id).await.unwrap().unwrap();
        assert_ne!(s.phase, Phase::Failed, "never given up: {s:?}");
        assert_eq!(
            s.services["redis"].password, before.services["redis"].password,
            "the credentials stay published"
        );
        if let Some(n) = deaths(&s) {
            assert_eq!(s.phase, Phase::Healing, "{s:?}");
            assert!(
                s.message.contains("crash loop") && s.message.contains("next heal is at"),
                "{s:?}"
            );
            most = most.max(n);
        }
        if most >= 6 && at_cap.is_none() {
            at_cap = Some((std::time::Instant::now(), most));
        }
        if let Some((t, n)) = at_cap {
            if t.elapsed() > Duration::from_secs(6) {
                assert!(most >= n + 2, "still trying at the cap: {n} then {most}");
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        at_cap.is_some(),
        "the back-off reached its cap: {most} deaths seen"
    );
    controller.stop().await;

    // Fixed: the next controller heals it with the same credentials.
    let controller = env.start(env.config());
    let healed = eventually("healed once the image is fixed", READY, || async {
        let s = client.status(&id).await.unwrap()?;
        (s.phase == Phase::Ready).then_some(s)
    })
    .await;
    assert_eq!(
        healed.services["redis"].password,
        before.services["redis"].password
    );
    controller.stop().await;
}
