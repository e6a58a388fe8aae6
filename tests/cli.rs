//! The `sandboxd` binary end to end: `run` as a real process, driven by
//! `apply`, `get`, `list` and `delete`, stopped with SIGTERM.

mod common;

use common::{eventually, free_port, http_get, sandbox_id, TestEnv, BIN};
use std::process::{Command, Output};
use std::time::Duration;

fn sandboxd(env: &TestEnv, args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", &env.url)
        .output()
        .expect("run sandboxd");
    assert!(
        out.status.success(),
        "sandboxd {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test]
async fn the_binary_provisions_prints_env_lines_serves_metrics_and_stops_on_sigterm() {
    let env = TestEnv::new().await;
    let port = free_port();
    let mut child = env.spawn_binary(port, &[("SANDBOXD_ENV_PREFIX", "ROBOCO_TEST")]);

    eventually("/readyz answers 200", Duration::from_secs(30), || async {
        matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(())
    })
    .await;
    let (code, _) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(code, 200);

    let id = sandbox_id("cli");
    let out = sandboxd(
        &env,
        &[
            "apply",
            "--id",
            id.as_str(),
            "--services",
            "postgres,redis",
            "--features",
            "redis=search",
            "--wait",
            "90s",
        ],
    );
    let status: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("apply --wait prints JSON");
    assert_eq!(status["phase"], "ready");
    assert_eq!(
        status["services"]["redis"]["available_extensions"][0],
        "search"
    );

    let out = sandboxd(&env, &["get", id.as_str(), "--env"]);
    let lines = String::from_utf8(out.stdout).unwrap();
    for var in [
        "ROBOCO_TEST_DB_HOST",
        "ROBOCO_TEST_DB_PORT",
        "ROBOCO_TEST_DB_USER",
        "ROBOCO_TEST_DB_PASSWORD",
        "ROBOCO_TEST_DB_NAME",
        "ROBOCO_TEST_DB_URL",
        "ROBOCO_TEST_REDIS_HOST",
        "ROBOCO_TEST_REDIS_PORT",
        "ROBOCO_TEST_REDIS_PASSWORD",
        "ROBOCO_TEST_REDIS_URL",
    ] {
        assert!(
            lines.contains(&format!("export {var}='")),
            "{var} missing from:\n{lines}"
        );
    }

    let out = sandboxd(&env, &["list"]);
    let listing = String::from_utf8(out.stdout).unwrap();
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(id.as_str()) && l.contains("ready")),
        "{listing}"
    );

    let (code, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains(
            r#"controller_runtime_reconcile_total{controller="sandbox",result="success"}"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("sandboxd_provisions_total"), "{metrics}");

    sandboxd(&env, &["delete", id.as_str()]);
    eventually("containers gone", Duration::from_secs(30), || async {
        env.containers(Some(&id)).await.is_empty().then_some(())
    })
    .await;

    // SIGTERM: graceful stop with exit code 0.
    let pid = child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exit = eventually(
        "sandboxd exits after SIGTERM",
        Duration::from_secs(40),
        || {
            let r = child.0.try_wait().unwrap();
            async move { r }
        },
    )
    .await;
    assert!(exit.success(), "exit status {exit:?}");
}

#[test]
fn invalid_flags_and_rows_are_refused_with_messages_that_say_what_to_do() {
    let out = Command::new(BIN)
        .args(["apply", "--id", "Bad Id", "--services", "postgres"])
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use 1 to 63 characters"), "{err}");

    let out = Command::new(BIN)
        .args(["list"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set DATABASE_URL"), "{err}");
}
