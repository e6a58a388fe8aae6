//! The orchestrator examples (`examples/sql/orchestrator.sql`,
//! `examples/python/orchestrator.py`) run as they are documented, as child
//! processes, against a real controller, connected as an orchestrator role
//! registered with grant-orchestrator (own rows only), so the documented
//! contract and the examples cannot drift apart. The tools they need, psql
//! and the Python client package, are not optional here: `scripts/test.sh`
//! installs them.

use crate::common;

use common::{eventually, sandbox_id, TestEnv};
use sandboxd::domain::SandboxId;
use std::process::Output;
use std::time::Duration;

/// The examples wait at most 90 s for ready; this bounds the whole run.
const RUN_TIMEOUT: Duration = Duration::from_secs(150);

/// Panics unless `program args` runs and succeeds, saying how to install
/// `what`: scripts/test.sh does (ensure_example_tools and ensure_python_client in scripts/lib.sh).
fn require(what: &str, program: &str, args: &[&str], install: &str) {
    let ran = std::process::Command::new(program).args(args).output();
    let ok = matches!(&ran, Ok(out) if out.status.success());
    assert!(
        ok,
        "the orchestrator examples need {what}, which is missing ({program}: {}); install it \
         with `{install}`, or run scripts/test.sh, which installs it (see ensure_* in \
         scripts/lib.sh)",
        match &ran {
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            Err(e) => e.to_string(),
        }
    );
}

/// A controller (grace 0) and the URL of an orchestrator role of its state
/// database that sees only its own rows.
async fn controller_and_orchestrator(env: &TestEnv) -> (common::RunningController, String) {
    let controller = env.start(env.config());
    let (_, url) = env.create_login_role("orchestrator").await;
    sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY)
        .grant_orchestrator("orchestrator", true)
        .await
        .expect("grant-orchestrator");
    (controller, url)
}

/// Runs `program args` in the repository with `envs`, which must succeed;
/// its standard output.
async fn run_example(program: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("PGPASSWORD")
        .envs(envs.iter().copied())
        .kill_on_drop(true);
    let out: Output = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} did not end within {RUN_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n--- stdout\n{stdout}--- stderr\n{stderr}",
        out.status
    );
    stdout
}

/// Asserts that `stdout` has a line starting with each of `lines`, in order.
fn assert_lines_in_order(stdout: &str, lines: &[String]) {
    let mut rest = stdout.lines();
    for want in lines {
        assert!(
            rest.any(|line| line.starts_with(want.as_str())),
            "no line starting with {want:?} (in this order) in:\n{stdout}"
        );
    }
}

/// Released means gone: the row, then (grace 0) the containers and status.
async fn assert_released_and_torn_down(env: &TestEnv, id: &SandboxId) {
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM sandbox_desired WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the example released its row");
    eventually(
        "the released sandbox's containers and status to be gone",
        Duration::from_secs(60),
        || async {
            let status: i64 =
                sqlx::query_scalar("SELECT count(*) FROM sandbox_status WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_one(&env.pool)
                    .await
                    .ok()?;
            (env.containers(Some(id)).await.is_empty() && status == 0).then_some(())
        },
    )
    .await;
}

// Multi-threaded: the controller runs in this process while the test waits
// on the example.
#[tokio::test(flavor = "multi_thread")]
async fn the_sql_example_requests_waits_connects_and_releases_against_the_real_controller() {
    require(
        "psql",
        "psql",
        &["--version"],
        "apt-get install postgresql-client",
    );
    let env = TestEnv::new().await;
    let (controller, url) = controller_and_orchestrator(&env).await;
    let id = sandbox_id("sqlex");

    let stdout = run_example(
        "psql",
        &[
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            &format!("id={id}"),
            "-v",
            &format!("state_url={url}"),
            "-f",
            "examples/sql/orchestrator.sql",
            &url,
        ],
        &[],
    )
    .await;
    assert_lines_in_order(
        &stdout,
        &[
            format!("requested {id} at generation 1, incarnation "),
            format!("waiting for {id} to be ready"),
            format!("ready {id} after "),
            "connected to the sandbox postgres as sandbox: pg_trgm similarity of sandbox and sandboxd = 0.7".into(),
            format!("touched {id}"),
            format!("released {id}"),
        ],
    );
    assert_released_and_torn_down(&env, &id).await;
    controller.stop().await;
}

// Multi-threaded: the controller runs in this process while the test waits
// on the example.
#[tokio::test(flavor = "multi_thread")]
async fn the_python_example_requests_waits_uses_postgres_and_redis_and_releases_against_the_real_controller(
) {
    // The example uses the client package (clients/python), installed in
    // the environment ensure_python_client makes.
    let python = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/python-client-venv/bin/python"
    );
    require(
        "the sandboxd Python package (clients/python) and psycopg 3.2 or later",
        python,
        &[
            "-c",
            "import sys, sandboxd, psycopg; \
             sys.exit(tuple(int(p) for p in psycopg.__version__.split('.')[:2]) < (3, 2))",
        ],
        ". scripts/lib.sh; ensure_python_client",
    );
    let env = TestEnv::new().await;
    let (controller, url) = controller_and_orchestrator(&env).await;
    let id = sandbox_id("pyex");

    let stdout = run_example(
        python,
        &["examples/python/orchestrator.py", id.as_str()],
        &[("DATABASE_URL", &url)],
    )
    .await;
    assert_lines_in_order(
        &stdout,
        &[
            format!("requested {id} at generation 1, incarnation "),
            format!("waiting for {id} to be ready"),
            format!("ready {id} after "),
            "connected to the sandbox postgres as sandbox: pg_trgm similarity = 0.7".into(),
            "connected to the sandbox redis: PING answered PONG".into(),
            format!("touched {id}"),
            format!("released {id}"),
        ],
    );
    assert_released_and_torn_down(&env, &id).await;
    controller.stop().await;
}
