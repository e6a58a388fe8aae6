//! Seeds (`BENCH_ONLY=seed`): request to ready of a seeded sandbox next to
//! the same request without a seed, both measured in this run: cold (from
//! the engine's template, no pool: the seed is loaded), warm (a claim from
//! a pool learned from demand, for the seeded request the seed's own
//! pool), and busy (the second of two requests at once while such a pool
//! holds one container: it starts from a template, for the seeded request
//! the seed's template, which the pool's first container was copied into).
//! The seed is a schema with fixtures: for Postgres a table of 50 000 rows
//! and an index, for Redis 1 000 keys. Medians of `iters`, each sandbox
//! requested once the pool has refilled, released before the next.

use super::{common, median, start_controller, templates_built, Bench, READY_TIMEOUT};
use sandboxd::client::SandboxRequest;
use sandboxd::config::{ControllerConfig, PoolDemand};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// A schema with 50 000 rows of fixtures.
fn postgres_seed() -> String {
    "CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text NOT NULL);
     INSERT INTO customers SELECT i, 'customer ' || i, 'c' || i || '@example.test'
       FROM generate_series(1, 50000) i;
     CREATE INDEX customers_email ON customers (email);"
        .to_owned()
}

/// 1 000 keys of fixtures.
fn redis_seed() -> String {
    (1..=1000)
        .map(|i| format!("SET customer:{i} \"customer {i}\"\n"))
        .collect()
}

/// One engine's figures: unseeded and seeded, cold, warm and busy.
struct Row {
    engine: &'static str,
    cold: [Vec<Duration>; 2],
    warm: [Vec<Duration>; 2],
    busy: [Vec<Duration>; 2],
}

fn ask(engine: &str, seed: Option<&str>) -> SandboxRequest {
    SandboxRequest {
        owner: "bench".into(),
        services: vec![engine.to_owned()],
        seeds: seed
            .map(|s| [(engine.to_owned(), s.to_owned())].into())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// Provisions `req` once: the time from the request to ready seen by the
/// client; then releases it and waits until it is gone.
async fn once(bench: &Bench, req: &SandboxRequest) -> Duration {
    let id = common::sandbox_id("seedbench");
    let t0 = Instant::now();
    bench
        .client
        .provision(&id, req, READY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("sandbox {id}: {e}"));
    let took = t0.elapsed();
    bench.client.release(&id).await.expect("release");
    common::eventually("teardown", READY_TIMEOUT, || async {
        let status = bench.client.status(&id).await.expect("status");
        let containers = bench.env.containers(Some(&id)).await;
        (status.is_none() && containers.is_empty()).then_some(())
    })
    .await;
    took
}

/// Provisions `req` twice at once, while the pool holds one container: the
/// time to ready of the slower (the one the pool could not serve).
async fn pair(bench: &Bench, req: &SandboxRequest) -> Duration {
    let (a, b) = tokio::join!(once(bench, req), once(bench, req));
    a.max(b)
}

/// Waits until the learned pool of `engine` holds a ready container.
async fn pool_ready(controller: &common::RunningController, engine: &str) {
    common::eventually("a ready pool container", READY_TIMEOUT, || async {
        let ready = common::sample(
            &controller.metrics.render(),
            &format!("sandboxd_pool_size{{engine=\"{engine}\",state=\"ready\"}}"),
        );
        (ready.unwrap_or(0.0) >= 1.0).then_some(())
    })
    .await;
}

fn config(base: &ControllerConfig, pool: bool) -> ControllerConfig {
    let mut c = base.clone();
    c.templates = true;
    c.warm_pool = Default::default();
    c.warm_pool_demand = if pool {
        PoolDemand {
            max: 1,
            window: Duration::from_secs(600),
        }
    } else {
        PoolDemand::off()
    };
    c
}

/// The comparison, as a markdown section.
pub(super) async fn compare(bench: &Bench, iters: usize) -> String {
    let mut rows = Vec::new();
    for (engine, content) in [("postgres", postgres_seed()), ("redis", redis_seed())] {
        let hash = bench
            .client
            .put_seed(engine, content.as_bytes(), Some("bench"))
            .await
            .expect("register the seed");
        let plain = ask(engine, None);
        let seeded = ask(engine, Some(&hash));
        let mut row = Row {
            engine,
            cold: [Vec::new(), Vec::new()],
            warm: [Vec::new(), Vec::new()],
            busy: [Vec::new(), Vec::new()],
        };
        // Cold: templates on, no pool.
        let controller = start_controller(&bench.env, config(&bench.config, false)).await;
        once(bench, &plain).await;
        if engine == "postgres" {
            templates_built(&controller, 1.0).await;
        }
        for i in 0..iters {
            for (k, req) in [(0, &plain), (1, &seeded)] {
                let took = once(bench, req).await;
                row.cold[k].push(took);
                eprintln!("bench: seed {engine} cold #{} {k}: {took:?}", i + 1);
            }
        }
        controller.stop().await;
        // Warm: one learned pool at a time (the request teaches it).
        for (k, req) in [(0, &plain), (1, &seeded)] {
            let controller = start_controller(&bench.env, config(&bench.config, true)).await;
            once(bench, req).await;
            for i in 0..iters {
                pool_ready(&controller, engine).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let took = once(bench, req).await;
                row.warm[k].push(took);
                eprintln!("bench: seed {engine} warm #{} {k}: {took:?}", i + 1);
                pool_ready(&controller, engine).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let took = pair(bench, req).await;
                row.busy[k].push(took);
                eprintln!("bench: seed {engine} busy #{} {k}: {took:?}", i + 1);
            }
            controller.stop().await;
        }
        rows.push(row);
    }
    report(&rows, iters)
}

fn report(rows: &[Row], iters: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## Seeds\n");
    let _ = writeln!(
        md,
        "Request to ready seen by the client, medians of {iters}: a sandbox whose row names a \
         seed (Postgres: a table of 50 000 rows and an index; Redis: 1 000 keys) against \
         the same request without one, measured in the same run. Cold: from the engine's \
         template, no pool (the seed is loaded as the agent once the engine is ready). \
         Warm: a claim from a pool learned from demand (the seed's own pool, whose \
         containers were seeded before they were offered). Busy: the slower of two \
         requests at once while that pool holds one container, which starts from a \
         template: for the seeded request the seed's template (the pool's first \
         container, copied once its seed was loaded), so it loads nothing.\n"
    );
    let _ = writeln!(
        md,
        "| engine | path | without seed ms | seeded ms | ratio |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|");
    for row in rows {
        for (path, figures) in [
            ("cold", &row.cold),
            ("warm", &row.warm),
            ("busy", &row.busy),
        ] {
            let floor = median(&figures[0]).as_secs_f64();
            let seeded = median(&figures[1]).as_secs_f64();
            let _ = writeln!(
                md,
                "| {} | {path} | {:.0} | {:.0} | {:.2} |",
                row.engine,
                floor * 1e3,
                seeded * 1e3,
                seeded / floor
            );
        }
    }
    md
}
