//! The isolation level `gvisor` on the real Docker engine: engines run
//! under gVisor's `runsc` with the same hardening as under runc, answer
//! with their published credentials, and see gVisor's kernel, not the
//! host's; a gVisor sandbox is never served a runc warm-pool container, and
//! a row that raises its level moves to a new container. The tests that
//! start engines skip (saying so) where dockerd has no runtime `runsc`;
//! scripts/test.sh registers it (`ensure_runsc install`, scripts/lib.sh).

use crate::common;

use bollard::query_parameters::InspectContainerOptions;
use common::{exec_in, host_pg_url, request, sandbox_id, TestEnv};
use sandboxd::client::{Client, Request, SandboxRequest};
use sandboxd::config::warm_pools;
use sandboxd::domain::isolation::Isolation;
use sandboxd::domain::{SandboxId, SandboxStatus};
use sandboxd::ports::runtime::{Containers, Host};
use sqlx::Connection;
use std::time::Duration;

/// gVisor starts engines more slowly than runc (Postgres: initdb and
/// start about 4 s here).
const READY: Duration = Duration::from_secs(180);

/// Whether dockerd has gVisor registered; says why a test skips if not.
async fn runsc_registered(env: &TestEnv, test: &str) -> bool {
    let runtimes = env
        .runtime
        .oci_runtimes()
        .await
        .expect("docker info")
        .unwrap_or_default();
    if runtimes.iter().any(|r| r == "runsc") {
        return true;
    }
    eprintln!(
        "SKIPPED {test}: dockerd has no runtime runsc (it has {runtimes:?}); \
         scripts/test.sh registers it (ensure_runsc install in scripts/lib.sh)"
    );
    false
}

fn under_gvisor(mut req: SandboxRequest) -> SandboxRequest {
    req.isolation = Some(Isolation::Gvisor);
    req
}

/// `docker inspect`'s runtime of `container` (a name or id).
async fn runtime_of(env: &TestEnv, container: &str) -> Option<String> {
    env.docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await
        .unwrap()
        .host_config
        .unwrap()
        .runtime
}

/// The container of `engine` that serves the sandbox `id`, by its name
/// (a claimed pool container carries no sandbox label).
async fn container_of(env: &TestEnv, id: &SandboxId, engine: &str) -> String {
    format!("sandboxd.{}.{}.{}", env.deployment, id, engine)
}

async fn redis_set_get(status: &SandboxStatus, engine: &str) {
    let s = &status.services[engine];
    let url = format!(
        "redis://:{}@127.0.0.1:{}/0",
        s.password.expose(),
        s.host_port
    );
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{engine}: login with the published password: {e}"));
    let () = redis::cmd("SET")
        .arg("k")
        .arg("under gvisor")
        .query_async(&mut con)
        .await
        .unwrap();
    let got: String = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(got, "under gvisor", "{engine}");
}

#[tokio::test]
async fn postgres_redis_and_valkey_are_ready_under_gvisor_hardened_as_under_runc_on_another_kernel()
{
    let env = TestEnv::new().await;
    if !runsc_registered(
        &env,
        "gvisor::postgres_redis_and_valkey_are_ready_under_gvisor…",
    )
    .await
    {
        return;
    }
    let mut config = env.config();
    config.images = common::test_images_with_valkey();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("gvisor");
    let req = under_gvisor(request(&["postgres", "redis", "valkey"], &[]));
    let status = client
        .provision(&id, &req, READY)
        .await
        .unwrap_or_else(|e| panic!("{id} ready under gVisor: {e}"));

    // They work: the published credentials log in and write.
    let mut pg = sqlx::PgConnection::connect(&host_pg_url(&status.services["postgres"]))
        .await
        .expect("postgres login with the published password");
    sqlx::query("CREATE TABLE t AS SELECT 1 AS x")
        .execute(&mut pg)
        .await
        .unwrap();
    let x: i32 = sqlx::query_scalar("SELECT x FROM t")
        .fetch_one(&mut pg)
        .await
        .unwrap();
    assert_eq!(x, 1);
    redis_set_get(&status, "redis").await;
    redis_set_get(&status, "valkey").await;

    let host_kernel = std::fs::read_to_string("/proc/version").unwrap();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for engine in ["postgres", "redis", "valkey"] {
        let name = container_of(&env, &id, engine).await;
        let info = env
            .docker
            .inspect_container(&name, None::<InspectContainerOptions>)
            .await
            .unwrap();
        let host = info.host_config.unwrap();
        let user = info.config.unwrap().user.unwrap_or_default();
        // Under gVisor's runtime, hardened as every sandbox container.
        assert_eq!(host.runtime.as_deref(), Some("runsc"), "{name}");
        assert_eq!(host.readonly_rootfs, Some(true), "{name}: read-only root");
        assert_eq!(user, "999:999", "{name}");
        assert_eq!(host.cap_drop.unwrap_or_default(), ["ALL"], "{name}");
        assert!(host.cap_add.unwrap_or_default().is_empty(), "{name}");
        assert!(
            host.security_opt
                .unwrap_or_default()
                .iter()
                .any(|o| o.starts_with("no-new-privileges")),
            "{name}"
        );

        // Inside: uid 999, no capabilities, a root it cannot write, and
        // gVisor's kernel where the host's would be.
        let (code, out) = exec_in(
            &env,
            &name,
            "id -u; grep '^CapEff' /proc/self/status; \
             touch /sandboxd-root-write 2>/dev/null && echo root-writable; \
             echo; cat /proc/version; uname -r",
            Vec::new(),
        )
        .await;
        assert_eq!(code, 0, "{name}: {out}");
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("999"), "{name}: {out}");
        assert_eq!(
            lines
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>()),
            Some(vec!["CapEff:", "0000000000000000"]),
            "{name}: {out}"
        );
        assert!(!out.contains("root-writable"), "{name}: {out}");
        let kernel: Vec<&str> = out
            .split("\n\n")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .collect();
        assert_eq!(kernel.len(), 2, "{name}: {out}");
        assert_ne!(
            kernel[0],
            host_kernel.trim(),
            "{name}: the host's /proc/version"
        );
        assert_ne!(
            kernel[1],
            host_release.trim(),
            "{name}: the host's kernel release"
        );
        eprintln!(
            "{name}: uname -r {} (the host's: {})",
            kernel[1],
            host_release.trim()
        );
    }
    controller.stop().await;
}

#[tokio::test]
async fn a_gvisor_sandbox_is_never_served_a_runc_pool_container_and_a_raised_row_moves_to_runsc() {
    let env = TestEnv::new().await;
    if !runsc_registered(
        &env,
        "gvisor::a_gvisor_sandbox_is_never_served_a_runc_pool_container…",
    )
    .await
    {
        return;
    }
    let mut config = env.config();
    config.warm_pool = warm_pools(&["redis=1".to_owned()]).unwrap();
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let pool = || async { env.runtime.pool_containers(&env.deployment).await.unwrap() };
    common::eventually("a ready warm-pool container", READY, || async {
        let text = controller.metrics.render();
        (common::sample(
            &text,
            "sandboxd_pool_size{engine=\"redis\",state=\"ready\"}",
        ) == Some(1.0))
        .then_some(())
    })
    .await;
    let unclaimed = pool().await;
    assert_eq!(unclaimed.len(), 1, "{unclaimed:?}");
    let (pooled, pool_name) = (unclaimed[0].id.clone(), unclaimed[0].name.clone());
    assert_eq!(unclaimed[0].isolation, Isolation::Container);
    // Docker records its default runtime's name (runc) on the others.
    assert_ne!(
        runtime_of(&env, pooled.as_str()).await.as_deref(),
        Some("runsc")
    );

    // A gVisor sandbox starts cold under runsc; the runc pool container
    // stays unclaimed.
    let gv = sandbox_id("gvpool");
    let status = client
        .provision(&gv, &under_gvisor(request(&["redis"], &[])), READY)
        .await
        .unwrap_or_else(|e| panic!("{gv} ready: {e}"));
    redis_set_get(&status, "redis").await;
    let name = container_of(&env, &gv, "redis").await;
    assert_eq!(runtime_of(&env, &name).await.as_deref(), Some("runsc"));
    // A claim renames the pool container to the sandbox's container name.
    let still = pool().await;
    assert!(
        still.iter().any(|c| c.id == pooled && c.name == pool_name),
        "the runc pool container is still unclaimed: {still:?}"
    );

    // A default row is served by it (the pool works), and raising that
    // row to gVisor moves it to a new container under runsc with fresh
    // credentials.
    let plain = sandbox_id("plain");
    let revision = client
        .request(
            &plain,
            &Request {
                services: vec!["redis".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let before = client.wait_ready(&plain, &revision, READY).await.unwrap();
    let served_by = container_of(&env, &plain, "redis").await;
    assert_ne!(runtime_of(&env, &served_by).await.as_deref(), Some("runsc"));
    let revision = client
        .request(
            &plain,
            &Request {
                isolation: Some(Isolation::Gvisor),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let after = client.wait_ready(&plain, &revision, READY).await.unwrap();
    assert_ne!(
        after.services["redis"].password.expose(),
        before.services["redis"].password.expose(),
        "fresh credentials"
    );
    redis_set_get(&after, "redis").await;
    let containers = env.containers(Some(&plain)).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0].labels.isolation, Isolation::Gvisor);
    assert_eq!(
        runtime_of(&env, containers[0].id.as_str()).await.as_deref(),
        Some("runsc")
    );
    controller.stop().await;
}

#[tokio::test]
async fn the_database_checks_isolation_and_a_change_of_it_is_a_new_generation() {
    let env = TestEnv::new().await;
    let id = sandbox_id("iso");
    let err = sqlx::query(
        "INSERT INTO sandbox_desired (id, services, isolation) VALUES ($1, '{redis}', 'microvm')",
    )
    .bind(id.as_str())
    .execute(&env.pool)
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("isolation of sandbox")
            && err.contains("use 'container'")
            && err.contains("'gvisor'"),
        "{err}"
    );

    // sandbox_request sets it when given and keeps it when not.
    let generation: i64 =
        sqlx::query_scalar("SELECT sandbox_request($1, NULL, '{redis}', p_isolation => 'gvisor')")
            .bind(id.as_str())
            .fetch_one(&env.pool)
            .await
            .unwrap();
    let read = |env: &TestEnv, id: &SandboxId| {
        let (pool, id) = (env.pool.clone(), id.as_str().to_owned());
        async move {
            sqlx::query_as::<_, (Option<String>, i64)>(
                "SELECT isolation, generation FROM sandbox_desired WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(read(&env, &id).await, (Some("gvisor".into()), generation));
    let again: i64 = sqlx::query_scalar("SELECT sandbox_request($1, NULL, '{}')")
        .bind(id.as_str())
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(read(&env, &id).await, (Some("gvisor".into()), again));

    // A change of isolation alone is a new generation (the controller
    // re-provisions); writing the same value is not.
    sqlx::query("UPDATE sandbox_desired SET isolation = 'container' WHERE id = $1")
        .bind(id.as_str())
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(read(&env, &id).await, (Some("container".into()), again + 1));
    sqlx::query("UPDATE sandbox_desired SET isolation = 'container' WHERE id = $1")
        .bind(id.as_str())
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(read(&env, &id).await.1, again + 1);

    // The controller reads it back.
    let client = Client::from_pool(env.pool.clone());
    let row = client.desired(&id).await.unwrap().expect("the row");
    assert_eq!(row.isolation, Some(Isolation::Container));
    assert!(row.invalid.is_none(), "{:?}", row.invalid);
}
