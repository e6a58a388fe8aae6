//! The `sandboxd` binary end to end: `run` as a real process, driven by
//! `apply`, `request`, `get`, `list`, `touch` and `release`, stopped with
//! SIGTERM.

use crate::common;

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

    let empty = state_home("empty");
    let out = Command::new(BIN)
        .args(["list"])
        .env_remove("DATABASE_URL")
        .env("SANDBOXD_HOME", &empty)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set DATABASE_URL"), "{err}");
    assert!(err.contains("scripts/run.sh"), "{err}");

    // A recorded URL whose database does not answer: the message names the file.
    use std::os::unix::fs::PermissionsExt;
    let file = empty.join("database-url");
    std::fs::write(&file, "postgres://sandboxd:x@127.0.0.1:1/sandboxd\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(BIN)
        .args(["list"])
        .env_remove("DATABASE_URL")
        .env("SANDBOXD_HOME", &empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to the state database"),
        "{err}"
    );
    assert!(
        err.contains(&format!("the URL came from {}", file.display())),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&empty);
}

/// A fresh state directory for the CLI (`SANDBOXD_HOME`).
fn state_home(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sandboxd-home-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

// Multi-threaded: the controller runs in this process while the test
// blocks on the binary.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_database_flag_or_variable_the_cli_uses_the_url_run_sh_recorded_and_says_so_with_v(
) {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new().await;
    let controller = env.start(env.config());
    let home = state_home("recorded");
    let file = home.join("database-url");
    std::fs::write(&file, format!("{}\n", env.url)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let id = sandbox_id("found");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env_remove("DATABASE_URL")
            .env("SANDBOXD_HOME", &home)
            .output()
            .expect("run sandboxd")
    };
    let out = run(&[
        "-v",
        "apply",
        "--id",
        id.as_str(),
        "--services",
        "redis",
        "--wait",
        "60s",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("(from {})", file.display())),
        "-v names the file: {err}"
    );
    let password = env
        .url
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .and_then(|(u, _)| u.split_once(':'))
        .map(|(_, p)| p.to_owned())
        .expect("the test URL has a password");
    assert!(!err.contains(&password), "-v shows no password: {err}");
    let out = run(&["list"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(id.as_str()));

    // A URL file others can read is refused with the fix.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&["list"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
    let _ = std::fs::remove_dir_all(&home);
    controller.stop().await;
}

/// Runs `sandboxd ARGS` against the test's database, whatever its outcome.
fn sandboxd_any(env: &TestEnv, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", &env.url)
        .output()
        .expect("run sandboxd")
}

// Multi-threaded: the controller runs in this process while the test
// blocks on the binary.
#[tokio::test(flavor = "multi_thread")]
async fn request_with_wait_and_export_prints_lines_a_shell_can_eval() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.env_prefix = "ROBOCO_TEST".into();
    let controller = env.start(config);
    let id = sandbox_id("export");

    // What the provisioner's agents did.
    let script = format!(
        r#"eval "$("$1" request {id} --services postgres,redis --wait 90s --export)" || exit 9
           printf '%s\n' "$ROBOCO_TEST_DB_HOST" "$ROBOCO_TEST_DB_PASSWORD" "$ROBOCO_TEST_DB_URL" "$ROBOCO_TEST_REDIS_URL""#
    );
    let out = Command::new("bash")
        .args(["-c", &script, "bash", BIN])
        .env("DATABASE_URL", &env.url)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "eval failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let status = sandboxd::client::Client::from_pool(env.pool.clone())
        .status(&id)
        .await
        .unwrap()
        .expect("a status");
    let (pg, redis) = (
        &status.services["postgres"].env,
        &status.services["redis"].env,
    );
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [
            pg["ROBOCO_TEST_DB_HOST"].as_str(),
            &pg["ROBOCO_TEST_DB_PASSWORD"],
            &pg["ROBOCO_TEST_DB_URL"],
            &redis["ROBOCO_TEST_REDIS_URL"],
        ]
    );

    // Without --export: the status as JSON, like `get`.
    let out = sandboxd(&env, &["request", id.as_str(), "--wait", "90s"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["phase"], "ready");
    assert_eq!(json["observed_generation"], 2);
    // Without --wait: the generation to wait for.
    let out = sandboxd(&env, &["request", id.as_str()]);
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(
        said.contains(&format!("requested {id} at generation 3")),
        "{said}"
    );
    controller.stop().await;
}

// Multi-threaded: the controller runs in this process while the test
// blocks on the binary.
#[tokio::test(flavor = "multi_thread")]
async fn request_touch_and_release_exit_with_codes_that_tell_failed_from_timed_out() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    // The row below names an owner container that does not exist: a grace
    // window keeps it from being released before it is touched.
    config.grace = Duration::from_secs(600);
    let controller = env.start(config);

    // Failed (a container to attach that does not exist): exit 3.
    let failing = sandbox_id("fail");
    let missing = format!("missing-{}", env.deployment);
    let out = sandboxd_any(
        &env,
        &[
            "request",
            failing.as_str(),
            "--services",
            "redis",
            "--attach",
            &missing,
            "--wait",
            "90s",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!("sandbox {failing} failed")) && err.contains(&missing),
        "{err}"
    );

    // Timed out: exit 4.
    let slow = sandbox_id("slow");
    let out = sandboxd_any(
        &env,
        &[
            "request",
            slow.as_str(),
            "--services",
            "redis",
            "--wait",
            "0s",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(&format!("sandbox {slow} was not ready within")),
        "{err}"
    );

    // --export needs --wait; invalid arguments exit 2.
    let out = sandboxd_any(&env, &["request", slow.as_str(), "--export"]);
    assert_eq!(out.status.code(), Some(2));

    // apply takes the lifecycle columns.
    sandboxd(
        &env,
        &[
            "apply",
            "--id",
            slow.as_str(),
            "--services",
            "redis",
            "--idle-timeout",
            "30m",
            "--owner-container",
            "agent-7",
        ],
    );
    let (idle, container, persistent): (Option<String>, Option<String>, bool) = sqlx::query_as(
        "SELECT idle_timeout::text, owner_container, persistent FROM sandbox_desired WHERE id = $1",
    )
    .bind(slow.as_str())
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        (idle.as_deref(), container.as_deref(), persistent),
        (Some("00:30:00"), Some("agent-7"), false)
    );
    let out = sandboxd_any(
        &env,
        &[
            "apply",
            "--id",
            slow.as_str(),
            "--services",
            "redis",
            "--persistent",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("persistent of sandbox") && err.contains("release"),
        "{err}"
    );

    // Touch: 0 when there is something to touch, 1 and what to do otherwise.
    let out = sandboxd(&env, &["touch", slow.as_str()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("touched {slow}")));
    let out = sandboxd_any(&env, &["touch", "no-such-sandbox"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("request it again"), "{err}");

    // Release, and its old name.
    let out = sandboxd(&env, &["release", slow.as_str()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("released {slow}")));
    let out = sandboxd(&env, &["delete", failing.as_str()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("released {failing}")));
    let out = sandboxd(&env, &["delete", failing.as_str()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to release"));
    controller.stop().await;
}

// Multi-threaded: the controller runs in this process while the test
// blocks on the binary.
#[tokio::test(flavor = "multi_thread")]
async fn wait_prints_each_phase_with_its_time_on_a_terminal_and_stays_quiet_when_piped() {
    let env = TestEnv::new().await;
    let controller = env.start(env.config());

    // Piped (as here): standard output is the status as JSON, standard
    // error says nothing.
    let quiet = sandbox_id("quiet");
    let out = sandboxd(
        &env,
        &[
            "apply",
            "--id",
            quiet.as_str(),
            "--services",
            "redis",
            "--wait",
            "60s",
        ],
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["phase"], "ready");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // On a terminal (script(1) gives the command one): a line per phase,
    // with the seconds since the request, ending with ready.
    let shown = sandbox_id("shown");
    let command =
        format!("{BIN} request {shown} --services redis --wait 60s >/dev/null; echo exit=$?");
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("DATABASE_URL", &env.url)
        .output()
        .expect("script(1) from util-linux");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(text.contains("exit=0"), "{text}");
    let phases: Vec<(f64, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let secs = words.next()?.strip_suffix('s')?.parse().ok()?;
            Some((secs, words.next()?))
        })
        .collect();
    // The first look may already find sandboxd at work.
    assert!(
        matches!(
            phases.first().map(|p| p.1),
            Some("pending" | "provisioning")
        ),
        "{text}"
    );
    assert!(phases.len() >= 2, "a phase before ready: {text}");
    assert_eq!(phases.last().map(|p| p.1), Some("ready"), "{text}");
    assert!(
        phases
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 != w[1].1),
        "{text}"
    );

    // --progress always: the same on standard error, whatever it is.
    let out = sandboxd(
        &env,
        &[
            "request",
            shown.as_str(),
            "--wait",
            "60s",
            "--progress",
            "always",
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.lines().last().is_some_and(|l| l.ends_with("ready")),
        "{said}"
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON on stdout");
    controller.stop().await;
}

// Multi-threaded: the controller runs in this process while the test
// blocks on the binary.
#[tokio::test(flavor = "multi_thread")]
async fn list_prints_an_aligned_table_or_json_and_get_takes_an_output_format() {
    let env = TestEnv::new().await;
    // A row no controller has seen yet is listed, pending.
    let early = sandbox_id("early");
    sandboxd(
        &env,
        &["apply", "--id", early.as_str(), "--services", "redis"],
    );
    let listing = String::from_utf8(sandboxd(&env, &["list"]).stdout).unwrap();
    let line = listing
        .lines()
        .find(|l| l.starts_with(early.as_str()))
        .unwrap_or_else(|| panic!("{early} in\n{listing}"));
    assert!(
        line.contains("pending") && line.contains("has not written a status yet"),
        "{line}"
    );

    let controller = env.start(env.config());
    let ids = [sandbox_id("a"), sandbox_id("long-name-b")];
    for id in &ids {
        sandboxd(
            &env,
            &[
                "apply",
                "--id",
                id.as_str(),
                "--services",
                "redis",
                "--wait",
                "60s",
            ],
        );
    }
    let listing = String::from_utf8(sandboxd(&env, &["list"]).stdout).unwrap();
    let lines: Vec<&str> = listing.lines().collect();
    let header = lines[0];
    for column in ["ID", "PHASE", "ENGINES", "AGE", "HEALS", "MESSAGE"] {
        assert!(header.contains(column), "{header}");
    }
    let phase_at = header.find("PHASE").unwrap();
    for id in &ids {
        let line = lines
            .iter()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap_or_else(|| panic!("{id} in\n{listing}"));
        assert_eq!(line.find("ready"), Some(phase_at), "aligned:\n{listing}");
        assert!(line.contains("redis"), "{line}");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&sandboxd(&env, &["list", "-o", "json"]).stdout).unwrap();
    let entries = json.as_array().unwrap();
    for id in &ids {
        let e = entries
            .iter()
            .find(|e| e["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} in {json}"));
        assert_eq!(e["phase"], "ready");
        assert_eq!(e["engines"], serde_json::json!(["redis"]));
        assert_eq!(e["heals"], 0);
    }
    assert!(
        !json.to_string().contains("password"),
        "no credentials: {json}"
    );

    let env_lines = sandboxd(&env, &["get", ids[0].as_str(), "--output", "env"]).stdout;
    assert_eq!(
        env_lines,
        sandboxd(&env, &["get", ids[0].as_str(), "--env"]).stdout
    );
    assert!(String::from_utf8_lossy(&env_lines).contains("export SANDBOX_REDIS_PASSWORD='"));
    let json: serde_json::Value =
        serde_json::from_slice(&sandboxd(&env, &["get", ids[0].as_str(), "-o", "json"]).stdout)
            .unwrap();
    assert_eq!(json["phase"], "ready");
    controller.stop().await;
}

#[test]
fn completions_for_bash_zsh_and_fish_come_from_the_cli_definition_without_a_database() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout).unwrap();
        for word in ["describe", "request", "--show-secrets", "--progress"] {
            // fish names long flags `-l NAME`.
            let word = match (shell, word.strip_prefix("--")) {
                ("fish", Some(flag)) => format!("-l {flag}"),
                _ => word.to_owned(),
            };
            assert!(script.contains(&word), "{shell} completes {word}");
        }
    }
    // bash loads it and completes the subcommands.
    let out = Command::new("bash")
        .args([
            "-c",
            r#"source <("$1" completions bash) && COMP_WORDS=(sandboxd desc) COMP_CWORD=1 && _sandboxd sandboxd desc sandboxd && printf '%s\n' "${COMPREPLY[@]}""#,
            "bash",
            BIN,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "describe");
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is an invalid argument"
    );
}
