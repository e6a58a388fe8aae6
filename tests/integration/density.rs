//! Density: what an idle sandbox costs in memory, per engine, as Docker
//! stats count it (usage minus inactive page cache, tmpfs included), with
//! the default configuration (Postgres from its template, whose binaries
//! volume the containers share). Targets (issue 11): an idle Postgres
//! sandbox under 40 MiB, an idle Redis/Valkey sandbox under 10 MiB (see
//! docs/architecture.md "Density").
//! `SANDBOXD_MEMORY_STATS=1` prints each container's memory.stat.

use crate::common;

use common::{container_memory, eventually, request, sample, sandbox_id, TestEnv};
use sandboxd::client::Client;
use std::time::Duration;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const MIB: f64 = 1024.0 * 1024.0;

#[tokio::test(flavor = "multi_thread")]
async fn idle_postgres_and_redis_sandboxes_stay_within_their_memory_bounds() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.templates = true;
    let controller = env.start(config);
    eventually(
        "the Postgres template to be built",
        READY_TIMEOUT,
        || async {
            sample(
                &controller.metrics.render(),
                "sandboxd_template_builds_total{engine=\"postgres\",result=\"ok\"}",
            )
            .filter(|n| *n >= 1.0)
        },
    )
    .await;
    let client = Client::from_pool(env.pool.clone());
    let mut ids = Vec::new();
    for (engine, n) in [("postgres", 3), ("redis", 3)] {
        for i in 0..n {
            let id = sandbox_id(&format!("dens{engine}{i}"));
            client
                .provision(&id, &request(&[engine], &[]), READY_TIMEOUT)
                .await
                .expect("sandbox becomes ready");
            ids.push((engine, id));
        }
    }
    // Let them idle (checkpoints, autovacuum's first look, page cache).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let mut worst = std::collections::BTreeMap::<&str, f64>::new();
    for (engine, id) in &ids {
        for c in env.containers(Some(id)).await {
            let m = container_memory(&env.docker, c.id.as_str())
                .await
                .expect("docker reports the container's memory");
            eprintln!(
                "density: {engine} {} {:.1} MiB (tmpfs {:.1} MiB)",
                c.name,
                m.mib(),
                m.shmem_bytes as f64 / MIB
            );
            let w = worst.entry(engine).or_default();
            *w = w.max(m.mib());
        }
    }
    eprintln!("density: worst idle MiB per engine {worst:?}");
    assert_eq!(
        sample(
            &controller.metrics.render(),
            "sandboxd_container_starts_total{engine=\"postgres\",from=\"template\"}"
        ),
        Some(3.0),
        "every Postgres sandbox started from the template"
    );
    assert!(worst["postgres"] < 40.0, "postgres idle {worst:?}");
    assert!(worst["redis"] < 10.0, "redis idle {worst:?}");
    controller.stop().await;
}
