//! Pause on idle, resume on use, on the real Docker engine and a real state
//! Postgres: an idle sandbox whose row asks to pause is frozen (`docker
//! pause`) with its data and credentials, a touch thaws it, a client
//! connection keeps a sandbox in use, a paused container is not healed,
//! and a paused sandbox's release removes it.

use crate::common;

use common::{docker_ok, eventually, host_pg_url, request, sandbox_id, TestEnv};
use sandboxd::client::{Client, Request};
use sandboxd::domain::sandbox::IdleAction;
use sandboxd::domain::{Phase, SandboxId, SandboxStatus, ServiceStatus};
use sqlx::Connection;
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(90);
/// Counted from the request: longer than provisioning takes on a loaded
/// machine, so that the tests' first connections (to write data, or to
/// hold one open) reach a sandbox that is not frozen yet (one that is
/// accepts the connection and answers nothing).
const IDLE: Duration = Duration::from_secs(6);

async fn status(client: &Client, id: &SandboxId) -> SandboxStatus {
    client.status(id).await.unwrap().expect("a status row")
}

/// Waits until the status says `phase`.
async fn wait_for(
    client: &Client,
    id: &SandboxId,
    phase: Phase,
    within: Duration,
) -> SandboxStatus {
    eventually(&format!("{id} {phase}"), within, || async {
        let s = status(client, id).await;
        (s.phase == phase).then_some(s)
    })
    .await
}

/// `docker inspect`'s State.Paused of each of the sandbox's containers,
/// by engine.
async fn paused(env: &TestEnv, id: &SandboxId) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = env
        .containers(Some(id))
        .await
        .into_iter()
        .map(|c| {
            let state = docker_ok(&["inspect", "-f", "{{.State.Paused}}", c.id.as_str()]);
            (c.labels.engine.clone(), state.trim() == "true")
        })
        .collect();
    out.sort();
    out
}

fn redis_url(r: &ServiceStatus) -> String {
    format!(
        "redis://:{}@127.0.0.1:{}/0",
        r.password.expose(),
        r.host_port
    )
}

async fn redis_get(r: &ServiceStatus, key: &str) -> Option<String> {
    let client = redis::Client::open(redis_url(r)).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap()
}

async fn redis_set(r: &ServiceStatus, key: &str, value: &str) {
    let client = redis::Client::open(redis_url(r)).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(&mut con)
        .await
        .unwrap();
}

fn pausing(services: &[&str]) -> sandboxd::client::SandboxRequest {
    let mut req = request(services, &[]);
    req.idle_timeout = Some(IDLE);
    req.idle_action = IdleAction::Pause;
    req
}

#[tokio::test]
async fn an_idle_sandbox_that_asks_to_pause_is_frozen_and_a_touch_resumes_it_with_its_data_and_credentials(
) {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("pause");
    let ready = client
        .provision(&id, &pausing(&["postgres", "redis"]), READY)
        .await
        .unwrap();
    let pg = ready.services["postgres"].clone();
    let rd = ready.services["redis"].clone();
    {
        let mut conn = sqlx::PgConnection::connect(&host_pg_url(&pg))
            .await
            .unwrap();
        sqlx::raw_sql("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before the pause')")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    }
    redis_set(&rd, "kept", "before the pause").await;

    let frozen = wait_for(&client, &id, Phase::Paused, Duration::from_secs(30)).await;
    assert!(frozen.message.contains("paused"), "{}", frozen.message);
    assert_eq!(
        frozen.services, ready.services,
        "the credentials stay published"
    );
    assert_eq!(
        paused(&env, &id).await,
        [("postgres".to_owned(), true), ("redis".to_owned(), true)]
    );

    // A touch resumes it: the same containers, data and credentials.
    let touched = Instant::now();
    assert!(client.touch(&id).await.unwrap());
    let resumed = wait_for(&client, &id, Phase::Ready, Duration::from_secs(10)).await;
    let took = touched.elapsed();
    eprintln!("touch to ready: {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "touch to ready took {took:?}"
    );
    assert_eq!(resumed.services, ready.services);
    assert_eq!(
        paused(&env, &id).await,
        [("postgres".to_owned(), false), ("redis".to_owned(), false)]
    );
    let mut conn = sqlx::PgConnection::connect(&host_pg_url(&pg))
        .await
        .unwrap();
    let v: String = sqlx::query_scalar("SELECT v FROM kept")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "before the pause");
    conn.close().await.unwrap();
    assert_eq!(
        redis_get(&rd, "kept").await.as_deref(),
        Some("before the pause")
    );

    // Idle again: paused again; a request resumes it too.
    wait_for(&client, &id, Phase::Paused, Duration::from_secs(30)).await;
    let again = client
        .request_and_wait(&id, &Request::default(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(again.phase, Phase::Ready);
    assert_eq!(again.services, ready.services);
    // Each reconcile records its events after its status.
    eventually(
        "two pauses and two resumes recorded",
        Duration::from_secs(10),
        || async {
            let events: Vec<String> = sqlx::query_scalar(
                "SELECT reason FROM sandbox_events WHERE sandbox_id = $1 ORDER BY seq",
            )
            .bind(id.as_str())
            .fetch_all(&env.pool)
            .await
            .unwrap();
            (events.iter().filter(|r| *r == "paused").count() >= 2
                && events.iter().filter(|r| *r == "resumed").count() >= 2)
                .then_some(())
        },
    )
    .await;
    controller.stop().await;
}

#[tokio::test]
async fn a_sandbox_with_an_open_client_connection_is_neither_paused_nor_released_past_its_timeout()
{
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let to_pause = sandbox_id("held-pause");
    let to_release = sandbox_id("held-release");
    // One connection to each, open and silent, opened as soon as its
    // sandbox is ready: the idle timeout runs from then, and a connection
    // opened to a container already frozen would wait forever.
    let pg = client
        .provision(&to_pause, &pausing(&["postgres"]), READY)
        .await
        .unwrap()
        .services["postgres"]
        .clone();
    let mut held_pg = tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::PgConnection::connect(&host_pg_url(&pg)),
    )
    .await
    .expect("a connection to the ready Postgres within 10 s")
    .unwrap();
    let mut releasing = request(&["redis"], &[]);
    releasing.idle_timeout = Some(IDLE);
    let rd = client
        .provision(&to_release, &releasing, READY)
        .await
        .unwrap()
        .services["redis"]
        .clone();
    let held_redis = tokio::time::timeout(
        Duration::from_secs(10),
        redis::Client::open(redis_url(&rd))
            .unwrap()
            .get_multiplexed_async_connection(),
    )
    .await
    .expect("a connection to the ready Redis within 10 s")
    .unwrap();

    // Three idle timeouts and a relist later: still in use.
    tokio::time::sleep(IDLE * 3 + Duration::from_secs(1)).await;
    assert_eq!(status(&client, &to_pause).await.phase, Phase::Ready);
    assert_eq!(
        paused(&env, &to_pause).await,
        [("postgres".to_owned(), false)]
    );
    assert_eq!(status(&client, &to_release).await.phase, Phase::Ready);
    assert_eq!(
        paused(&env, &to_release).await,
        [("redis".to_owned(), false)]
    );
    let last_used: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT last_used_at FROM sandbox_desired WHERE id = $1")
            .bind(to_pause.as_str())
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(
        chrono::Utc::now() - last_used < chrono::Duration::seconds(8),
        "the connection was recorded as a use: last used {last_used}"
    );
    // Bounded: a container frozen under the connection would never answer.
    let one: i32 = tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::query_scalar("SELECT 1").fetch_one(&mut held_pg),
    )
    .await
    .expect("the held connection answers within 10 s (was its container paused under it?)")
    .unwrap();
    assert_eq!(one, 1, "the held connection still works");

    // The clients go: paused and released once idle. (Dropped, not closed:
    // a close waits for the server's goodbye, which never comes if the
    // controller freezes the container the moment the session is gone.)
    drop(held_pg);
    drop(held_redis);
    wait_for(&client, &to_pause, Phase::Paused, Duration::from_secs(30)).await;
    wait_for(
        &client,
        &to_release,
        Phase::Terminating,
        Duration::from_secs(30),
    )
    .await;
    controller.stop().await;
}

#[tokio::test]
async fn a_paused_container_is_not_healed_and_releasing_a_paused_sandbox_removes_it() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("paused-rm");
    client
        .provision(&id, &pausing(&["redis"]), READY)
        .await
        .unwrap();
    wait_for(&client, &id, Phase::Paused, Duration::from_secs(30)).await;
    let before: Vec<String> = env
        .containers(Some(&id))
        .await
        .into_iter()
        .map(|c| c.id.as_str().to_owned())
        .collect();
    // Two relists (every 5 s) look at it: alive, kept, still frozen.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after: Vec<String> = env
        .containers(Some(&id))
        .await
        .into_iter()
        .map(|c| c.id.as_str().to_owned())
        .collect();
    assert_eq!(after, before, "not healed or re-created");
    assert_eq!(paused(&env, &id).await, [("redis".to_owned(), true)]);
    assert_eq!(status(&client, &id).await.phase, Phase::Paused);

    let released = Instant::now();
    assert!(client.release(&id).await.unwrap());
    eventually(
        "the paused sandbox removed",
        Duration::from_secs(30),
        || async { env.containers(Some(&id)).await.is_empty().then_some(()) },
    )
    .await;
    // Thawed first, so the stop signal is taken: no wait for a kill.
    eprintln!("release of a paused sandbox: {:?}", released.elapsed());
    controller.stop().await;
}

#[tokio::test]
async fn an_orchestrator_role_sets_idle_action_through_sandbox_request_and_a_touch_wakes_sandboxd_only_for_a_row_it_may_resume(
) {
    use sqlx::postgres::PgListener;
    let env = TestEnv::new().await;
    let (orch, _) = env.create_login_role("orchestrator").await;
    sqlx::query("SELECT sandbox_grant_orchestrator('orchestrator', true)")
        .execute(&env.pool)
        .await
        .unwrap();
    let action = |id: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_as::<_, (String, i64)>(
                "SELECT idle_action, generation FROM sandbox_desired WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };

    let g: i64 = sqlx::query_scalar(
        "SELECT sandbox_request('pauses', NULL, '{redis}', p_idle_timeout => '1 hour', p_idle_action => 'pause')",
    )
    .fetch_one(&orch)
    .await
    .unwrap();
    assert_eq!(action("pauses").await, ("pause".to_owned(), g));
    // NULL keeps the row's; a new row releases by default.
    sqlx::query("SELECT sandbox_request('pauses', NULL, '{}')")
        .execute(&orch)
        .await
        .unwrap();
    assert_eq!(action("pauses").await.0, "pause");
    sqlx::query("SELECT sandbox_request('releases', NULL, '{redis}')")
        .execute(&orch)
        .await
        .unwrap();
    assert_eq!(action("releases").await.0, "release");

    // Anything else is refused with what is allowed.
    let err = sqlx::query("SELECT sandbox_request('pauses', NULL, '{}', p_idle_action => 'sleep')")
        .execute(&orch)
        .await
        .unwrap_err();
    let db = err.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("23514"), "{err}");
    assert!(
        db.message().contains("'release'") && db.message().contains("'pause'"),
        "{err}"
    );

    // A change of it is a new generation.
    let (_, before) = action("pauses").await;
    sqlx::query("UPDATE sandbox_desired SET idle_action = 'release' WHERE id = 'pauses'")
        .execute(&orch)
        .await
        .unwrap();
    assert_eq!(action("pauses").await, ("release".to_owned(), before + 1));
    sqlx::query("UPDATE sandbox_desired SET idle_action = 'pause', idle_timeout = '1 second' WHERE id = 'pauses'")
        .execute(&orch)
        .await
        .unwrap();
    sqlx::query("SELECT sandbox_request('later', NULL, '{redis}', p_idle_timeout => '1 hour', p_idle_action => 'pause')")
        .execute(&orch)
        .await
        .unwrap();

    // Touches: a row that releases, or that pauses but is far from idle,
    // stays silent; a pausing row idle by now (or paused) wakes sandboxd.
    let mut listener = PgListener::connect(&env.url).await.unwrap();
    listener.listen("sandbox_desired").await.unwrap();
    for id in ["releases", "later", "pauses"] {
        let touched: bool = sqlx::query_scalar("SELECT sandbox_touch($1)")
            .bind(id)
            .fetch_one(&orch)
            .await
            .unwrap();
        assert!(touched, "{id}");
    }
    let first = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification")
        .unwrap();
    // The payload names the row by its incarnation (never its id).
    let pauses: String =
        sqlx::query_scalar("SELECT incarnation::text FROM sandbox_desired WHERE id = 'pauses'")
            .fetch_one(&orch)
            .await
            .unwrap();
    assert_eq!(first.payload(), pauses);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), listener.recv())
            .await
            .is_err(),
        "no other touch notified"
    );
}

// The CLI runs as a blocking child process: the in-process controller
// needs threads of its own meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_asks_for_a_pausing_sandbox_and_resume_brings_it_back_ready() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("cli-pause");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .env("DATABASE_URL", &env.url)
            .output()
            .expect("run sandboxd");
        assert!(
            out.status.success(),
            "sandboxd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    cli(&[
        "request",
        id.as_str(),
        "--services",
        "redis",
        "--idle-timeout",
        "2s",
        "--idle-action",
        "pause",
        "--wait",
        "90s",
        "--progress",
        "never",
    ]);
    wait_for(&client, &id, Phase::Paused, Duration::from_secs(30)).await;
    let out = cli(&["resume", id.as_str(), "--wait", "10s"]);
    let status: serde_json::Value = serde_json::from_str(&out).expect("the status as JSON");
    assert_eq!(status["phase"], "ready", "{out}");
    assert_eq!(paused(&env, &id).await, [("redis".to_owned(), false)]);
    controller.stop().await;
}

#[tokio::test]
async fn a_paused_sandbox_resumes_for_a_checkpoint_and_a_reset_and_keeps_its_data_and_credentials()
{
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("pauseckpt");
    let ready = client
        .provision(&id, &pausing(&["redis"]), READY)
        .await
        .unwrap();
    let rd = ready.services["redis"].clone();
    redis_set(&rd, "kept", "in the checkpoint").await;
    wait_for(&client, &id, Phase::Paused, Duration::from_secs(30)).await;
    assert_eq!(paused(&env, &id).await, [("redis".to_owned(), true)]);

    // A checkpoint of a paused sandbox is a use: it resumes, then records.
    let c = client
        .checkpoint(&id, "seed", Duration::from_secs(30))
        .await
        .expect("a paused sandbox's checkpoint is taken");
    assert_eq!(c.state, "ready", "{c:?}");
    assert_eq!(paused(&env, &id).await, [("redis".to_owned(), false)]);
    redis_set(&rd, "kept", "after the checkpoint").await;

    // Paused again, a reset resumes it too and brings the data back.
    wait_for(&client, &id, Phase::Paused, Duration::from_secs(30)).await;
    client
        .reset(&id, Some("seed"), Duration::from_secs(30))
        .await
        .expect("a paused sandbox's reset is done");
    let after = wait_for(&client, &id, Phase::Ready, Duration::from_secs(10)).await;
    assert_eq!(
        after.services, ready.services,
        "same credentials and endpoint"
    );
    assert_eq!(
        redis_get(&rd, "kept").await.as_deref(),
        Some("in the checkpoint")
    );
    client.release(&id).await.unwrap();
    controller.stop().await;
}
