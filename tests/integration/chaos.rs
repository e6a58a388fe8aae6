//! The chaos suite: while rows are added and released, sandbox containers
//! are killed, stopped, removed and OOM-killed at random, the controller is
//! SIGKILLed and restarted, and the state database's connections are
//! terminated and the database paused; afterwards every invariant holds: one
//! container per desired engine, none leaked, every ready status's
//! credentials log in, nothing of another deployment touched, and the
//! controller's metrics counted the heals. A short run in CI; set
//! `SANDBOXD_CHAOS_SOAK=10m` (any duration) for a long soak. The report is
//! written to `target/chaos-results.json`.

use crate::common;

use common::{eventually, free_port, http_get, request, sandbox_id, StateStorage, TestEnv};
use sandboxd::adapters::chaos::Fault;
use sandboxd::adapters::PgStore;
use sandboxd::chaos::{Chaos, ChaosOptions};
use sandboxd::cli::parse_duration;
use sandboxd::client::Client;
use sandboxd::domain::SandboxId;
use std::sync::Arc;
use std::time::Duration;

/// A container of another deployment that must come out untouched.
struct Canary(String);

impl Canary {
    fn start() -> Self {
        let name = format!("chaos-canary-{}", sandbox_id("c").as_str());
        let out = std::process::Command::new("docker")
            .args([
                "run",
                "-d",
                "--name",
                &name,
                "--label",
                "io.sandboxd.managed-by=sandboxd",
                "--label",
                "io.sandboxd.deployment=chaos-bystander",
                "--label",
                "sandboxd-test.agent=true",
                "--entrypoint",
                "sleep",
                "sandboxd/redis:8",
                "600",
            ])
            .output()
            .expect("run docker");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(name)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// The controller's `sandboxd_heals_total`, summed over engines and causes.
async fn heals_counted(port: u16) -> f64 {
    let Some((_, body)) = http_get(port, "/metrics").await else {
        return 0.0;
    };
    common::total(&body, "sandboxd_heals_total")
}

#[tokio::test]
async fn under_chaos_nothing_leaks_nothing_is_duplicated_and_no_credential_is_lost() {
    let soak = std::env::var("SANDBOXD_CHAOS_SOAK")
        .ok()
        .and_then(|v| parse_duration(&v).ok());
    let duration = soak.unwrap_or(Duration::from_secs(45));
    let faults = (duration.as_secs() / 3).max(10) as usize;
    // A server of its own: the test ends every session of the role
    // `sandboxd` and freezes the server.
    let env = TestEnv::new_with(StateStorage::Tmpfs).await;
    let client = Client::from_pool(env.pool.clone());
    let canary = Canary::start();

    let port = free_port();
    let mut controller = env.spawn_binary(port, &[("SANDBOXD_RELIST_INTERVAL", "5s")]);
    let mut fleet: Vec<SandboxId> = Vec::new();
    let mut revisions = Vec::new();
    for services in [
        &["redis"][..],
        &["redis"],
        &["redis"],
        &["postgres"],
        &["postgres"],
        &["postgres", "redis"],
    ] {
        let id = sandbox_id("chaos");
        revisions.push(client.apply(&id, &request(services, &[])).await.unwrap());
        fleet.push(id);
    }
    for (id, revision) in fleet.iter().zip(&revisions) {
        client
            .wait_ready(id, revision, Duration::from_secs(120))
            .await
            .unwrap();
    }

    let store = Arc::new(PgStore::with_engines(
        env.pool.clone(),
        sandboxd::engine::REGISTRY,
    ));
    let chaos = Chaos::new(
        (*env.runtime).clone(),
        store,
        ChaosOptions {
            deployment: env.deployment.clone(),
            faults,
            duration,
            kinds: Fault::ALL.to_vec(),
            seed: rand::random(),
            settle: Duration::from_secs(120),
        },
    )
    .unwrap();
    let others = chaos.others().await.unwrap();
    let started = tokio::time::Instant::now();

    // Rows come and go while the faults land.
    let churn = {
        let client = Client::from_pool(env.pool.clone());
        let mut fleet = fleet.clone();
        tokio::spawn(async move {
            let mut step = 0;
            while started.elapsed() < duration {
                tokio::time::sleep(Duration::from_secs(8)).await;
                let id = sandbox_id("churn");
                client.apply(&id, &request(&["redis"], &[])).await.unwrap();
                fleet.push(id);
                if step % 2 == 1 {
                    let gone = fleet.remove(0);
                    client.release(&gone).await.unwrap();
                }
                step += 1;
            }
        })
    };
    let injecting = tokio::spawn(async move {
        let records = chaos.inject().await;
        (chaos, records)
    });

    // The controller is SIGKILLed a fifth of the way in and started again.
    tokio::time::sleep(duration / 5).await;
    controller.signal("KILL");
    drop(controller);
    controller = env.spawn_binary(port, &[("SANDBOXD_RELIST_INTERVAL", "5s")]);
    let restarted = chrono::Utc::now();

    // Half way: the state database drops sandboxd's connections, then
    // stops answering for five seconds.
    tokio::time::sleep(duration * 3 / 10).await;
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'sandboxd' AND pid <> pg_backend_pid()")
        .execute(&env.admin_pool)
        .await
        .unwrap();
    env.pause_state_database(Duration::from_secs(5)).await;

    let (chaos, records) = injecting.await.unwrap();
    churn.await.unwrap();
    let report = chaos.check(records, &others).await.unwrap();
    let json = serde_json::to_string_pretty(&report).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chaos-results.json");
    std::fs::write(&path, &json).unwrap();
    eprintln!("chaos report ({}):\n{json}", path.display());

    assert!(
        report.records.len() >= faults / 2,
        "faults injected: {}",
        report.records.len()
    );
    assert!(report.leaked.is_empty(), "leaked: {:?}", report.leaked);
    assert!(
        report.duplicate.is_empty(),
        "duplicate: {:?}",
        report.duplicate
    );
    assert!(
        report.lost_credentials.is_empty(),
        "lost: {:?}",
        report.lost_credentials
    );
    assert!(
        report.unconverged.is_empty(),
        "unconverged: {:?}",
        report.unconverged
    );
    assert_eq!(report.unhealed, 0, "unhealed faults");
    // Other tests' containers come and go on this host; the canary is the
    // one nothing else touches.
    assert!(
        !report.others_touched.contains(&canary.0),
        "another deployment's container was touched"
    );
    assert!(report.passed(), "{json}");

    // The restarted controller counted the heals it made.
    let healed_since = report
        .records
        .iter()
        .filter(|r| {
            r.injected_at > restarted + chrono::Duration::seconds(5) && r.healed_after.is_some()
        })
        .count();
    let counted = eventually("the heals are counted", Duration::from_secs(10), || async {
        let n = heals_counted(port).await;
        (n >= healed_since as f64).then_some(n)
    })
    .await;
    assert!(counted >= healed_since as f64);
    drop(controller);
}

/// The same engine killed from outside again and again, each fault once
/// the previous heal is ready, as a chaos tool does: every kill is an
/// operator's, so none may count toward a crash loop, and every heal
/// publishes the same credentials, which log in and find the feature.
#[tokio::test]
async fn one_engine_killed_eight_times_in_a_row_is_healed_every_time_with_the_same_credentials() {
    use sandboxd::adapters::chaos::Injector;
    use sandboxd::domain::Phase;
    use sqlx::Connection;
    const KILLS: usize = 8;
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("rekill");
    let first = client
        .provision(
            &id,
            &request(&["postgres"], &[("postgres", "pg_trgm")]),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    let published = first.services["postgres"].clone();
    let url = common::host_pg_url(&first.services["postgres"]);
    // By name: a container claimed from a warm pool has the sandbox's
    // container name but not its labels.
    let postgres = sandboxd::engine::lookup("postgres").unwrap();
    let victim = sandboxd::domain::network::container_name(&env.deployment, &id, postgres.name());
    let injector = Injector::new((*env.runtime).clone());
    let faults = [Fault::Kill, Fault::Remove, Fault::Stop];
    let mut heals = first.services["postgres"].heals;
    for n in 1..=KILLS {
        let fault = faults[(n - 1) % faults.len()];
        injector
            .inject(fault, &victim, postgres.data_path())
            .await
            .unwrap_or_else(|e| panic!("fault {n} ({}): {e}", fault.as_str()));
        let healed = eventually(
            &format!("heal {n} (after `{}`)", fault.as_str()),
            Duration::from_secs(45),
            || async {
                let s = client.status(&id).await.unwrap()?;
                assert!(
                    s.phase != Phase::Failed,
                    "fault {n} ({}) was not healed: {}",
                    fault.as_str(),
                    s.message
                );
                (s.phase == Phase::Ready && s.services["postgres"].heals > heals).then_some(s)
            },
        )
        .await;
        let service = &healed.services["postgres"];
        heals = service.heals;
        let changed = published.connection_changes(service);
        assert!(
            changed.is_empty(),
            "heal {n} (after `{}`) published another {changed:?}",
            fault.as_str()
        );
        // What the status published still logs in, to the feature asked for.
        let mut conn = sqlx::PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("login after heal {n}: {e}"));
        let trgm: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'")
                .fetch_one(&mut conn)
                .await
                .unwrap();
        assert_eq!(trgm, 1, "pg_trgm after heal {n}");
        conn.close().await.unwrap();
    }
    assert!(heals >= KILLS as u32, "{heals} heals for {KILLS} faults");
    // One container serves it.
    let containers = env.containers(Some(&id)).await;
    assert!(containers.len() <= 1, "{containers:?}");
    controller.stop().await;
}
