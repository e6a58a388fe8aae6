//! The notification queue no tenant can jam (issue 50). Postgres has one
//! `NOTIFY` queue per cluster, and any role that may connect can pin it (a
//! `LISTEN`ing session left idle in a transaction keeps every notification
//! sent since) and fill it; a full queue fails every transaction that
//! notifies, at its commit. Here a tenant does exactly that, on a state
//! Postgres of this test's own with PG 17's smallest queue (64 pages: a
//! few dozen 8 KB payloads fill it), and every write still succeeds: the
//! database skips the notifications (and counts them), and the controller,
//! which works from its relists, brings the sandbox up, checkpoints it and
//! reaps it. Also: an orchestrator's session starts with the timeouts.

use crate::common;

use common::{eventually, StateStorage, TestEnv};
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use std::time::{Duration, Instant};

/// PG 17's least `max_notify_queue_pages` (8 KB each).
const QUEUE_PAGES: &str = "64";

/// The queue's usage, 0 to 1.
async fn usage(pool: &PgPool) -> f64 {
    sqlx::query_scalar("SELECT pg_notification_queue_usage()")
        .fetch_one(pool)
        .await
        .expect("read the queue's usage")
}

/// What the flood measured.
struct Flood {
    notifications: u32,
    to_quarter: Duration,
    to_full: Duration,
}

/// A tenant's attack: a session that LISTENs and stays idle in a
/// transaction (its own idle timeout turned off, as any session may), and
/// another that sends 8 KB notifications until Postgres refuses one
/// because the queue is full. Returns the pinning session (the pin lasts
/// as long as it does) and what the flood measured.
async fn pin_and_flood(attacker: &PgPool) -> (PoolConnection<Postgres>, Flood) {
    let mut pin = attacker.acquire().await.expect("the pinning session");
    // One statement at a time: LISTEN takes effect when its transaction
    // commits, which must be before the one left open.
    for sql in [
        "SET idle_in_transaction_session_timeout = 0",
        "LISTEN jam",
        "BEGIN",
        "SELECT 1",
    ] {
        sqlx::raw_sql(sql)
            .execute(&mut *pin)
            .await
            .unwrap_or_else(|e| panic!("pin the queue: {sql}: {e}"));
    }
    let mut flood = attacker.acquire().await.expect("the flooding session");
    let started = Instant::now();
    let mut to_quarter = None;
    for n in 1..=10_000u32 {
        let sent = sqlx::query("SELECT pg_notify('jam', repeat('x', 7990))")
            .execute(&mut *flood)
            .await;
        match sent {
            Ok(_) => {}
            Err(e) if e.to_string().contains("too many notifications") => {
                return (
                    pin,
                    Flood {
                        notifications: n - 1,
                        to_quarter: to_quarter.expect("the queue passed a quarter"),
                        to_full: started.elapsed(),
                    },
                );
            }
            Err(e) => panic!("flooding failed otherwise: {e}"),
        }
        if to_quarter.is_none() {
            let used: f64 = sqlx::query_scalar("SELECT pg_notification_queue_usage()")
                .fetch_one(&mut *flood)
                .await
                .unwrap();
            if used >= 0.25 {
                to_quarter = Some(started.elapsed());
            }
        }
    }
    panic!("10000 notifications of 8 KB did not fill a queue of {QUEUE_PAGES} pages");
}

/// Runs `sql` (binding `id`) as `pool`'s role and times it; panics with
/// the error (on main: "too many notifications in the NOTIFY queue").
async fn call(pool: &PgPool, sql: &str, id: &str) -> Duration {
    let started = Instant::now();
    sqlx::query(sql)
        .bind(id)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql} failed with the NOTIFY queue full: {e}"));
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_that_pins_and_fills_the_notify_queue_fails_no_request_status_write_checkpoint_or_release(
) {
    let env = TestEnv::new_with_settings(
        StateStorage::Tmpfs,
        &[("max_notify_queue_pages", QUEUE_PAGES)],
    )
    .await;
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(
        version >= 170000,
        "max_notify_queue_pages needs Postgres 17 (the state image runs {version})"
    );
    let mut config = env.config();
    // The controller hears nothing while the queue is full: it works from
    // its relists. No full resync in this test's time: what a relist
    // reconciles must be enough.
    config.relist_interval = Duration::from_secs(1);
    config.resync_interval = Duration::from_secs(3600);
    let controller = env.start(config);
    let (_, tenant) = env.own_rows_orchestrator("tenant").await;
    let (_, attacker) = env.own_rows_orchestrator("jammer").await;

    let (mut pin, flood) = pin_and_flood(&attacker).await;
    let full = usage(&env.pool).await;
    eprintln!(
        "flood: {} notifications of 8 KB, a quarter full after {:?}, full after {:?} (usage {full})",
        flood.notifications, flood.to_quarter, flood.to_full
    );
    assert!(full > 0.9, "the queue is full: {full}");

    // Every write of a tenant, and of the controller, still commits.
    let id = common::sandbox_id("jammed");
    let request = call(
        &tenant,
        "SELECT sandbox_request($1, NULL, '{redis}')",
        id.as_str(),
    )
    .await;
    let started = Instant::now();
    eventually("the sandbox ready", Duration::from_secs(120), || async {
        let phase: Option<String> =
            sqlx::query_scalar("SELECT phase FROM sandbox_status WHERE id = $1")
                .bind(id.as_str())
                .fetch_optional(&env.pool)
                .await
                .unwrap();
        (phase.as_deref() == Some("ready")).then_some(())
    })
    .await;
    let ready = started.elapsed();
    let checkpoint = call(
        &tenant,
        "SELECT sandbox_checkpoint($1, 'under-flood')",
        id.as_str(),
    )
    .await;
    // A pending checkpoint of a converged sandbox: a relist takes it up.
    eventually("the checkpoint ready", Duration::from_secs(60), || async {
        let state: Option<String> = sqlx::query_scalar(
            "SELECT state FROM sandbox_checkpoints WHERE sandbox_id = $1 AND name = 'under-flood'",
        )
        .bind(id.as_str())
        .fetch_optional(&tenant)
        .await
        .unwrap();
        (state.as_deref() == Some("ready")).then_some(())
    })
    .await;
    let touch = call(&tenant, "SELECT sandbox_touch($1)", id.as_str()).await;

    // The controller exports what it saw.
    let text = eventually("the queue's metrics", Duration::from_secs(30), || async {
        let text = controller.metrics.render();
        let used = common::sample(&text, "sandboxd_notify_queue_usage")?;
        let skipped = common::sample(&text, "sandboxd_notify_skipped_total")?;
        (used > 0.9 && skipped > 0.0).then_some(text)
    })
    .await;
    let skipped: i64 = sqlx::query_scalar("SELECT last_value FROM sandbox_notify_skipped")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(skipped > 0, "the database counted its skips");

    let release = call(&tenant, "SELECT sandbox_release($1)", id.as_str()).await;
    eventually("the sandbox reaped", Duration::from_secs(60), || async {
        env.containers(Some(&id)).await.is_empty().then_some(())
    })
    .await;
    // The pin still held throughout.
    let still = usage(&env.pool).await;
    assert!(still > 0.9, "the queue stayed full: {still}");
    eprintln!(
        "with the queue full: sandbox_request {request:?}, ready after {ready:?}, \
         sandbox_checkpoint {checkpoint:?}, sandbox_touch {touch:?}, sandbox_release {release:?}; \
         {skipped} notifications skipped; usage exported {:?}",
        common::sample(&text, "sandboxd_notify_queue_usage")
    );

    // What the runbook says: end the session holding the queue (found as
    // the oldest transaction idle in pg_stat_activity). It drains.
    let holder: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'
         ORDER BY xact_start LIMIT 1",
    )
    .fetch_one(&env.admin_pool)
    .await
    .unwrap();
    let pinned: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *pin)
        .await
        .unwrap();
    assert_eq!(holder, pinned, "the runbook's query finds the pin");
    // Its connection ends with its session.
    drop(pin.detach());
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(holder)
        .execute(&env.admin_pool)
        .await
        .unwrap();
    eventually("the queue drained", Duration::from_secs(30), || async {
        (usage(&env.pool).await < 0.25).then_some(())
    })
    .await;
    controller.stop().await;
}

/// Issue 50: every session of the state database, an orchestrator's
/// included, starts with an idle-in-transaction and a statement timeout
/// (sql/settings/database.sql); sandboxd's own sessions keep the
/// statement timeout of --store-timeout.
#[tokio::test]
async fn an_orchestrator_session_starts_with_the_idle_in_transaction_and_statement_timeouts() {
    let env = TestEnv::new_with(StateStorage::Tmpfs).await;
    let (_, orchestrator) = env.own_rows_orchestrator("timed").await;
    let (idle, statement): (String, String) = sqlx::query_as(
        "SELECT current_setting('idle_in_transaction_session_timeout'),
                current_setting('statement_timeout')",
    )
    .fetch_one(&orchestrator)
    .await
    .unwrap();
    assert_eq!((idle.as_str(), statement.as_str()), ("1min", "30s"));
    // The controller's bounded sessions set their own statement timeout.
    let store = sandboxd::adapters::PgStore::connect_with_engines(
        &env.url,
        1,
        Duration::from_secs(7),
        sandboxd::engine::REGISTRY,
    )
    .await
    .unwrap();
    let own: String = sqlx::query_scalar("SELECT current_setting('statement_timeout')")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(own, "7s");
}
