//! The Python client package (`clients/python`, import name `sandboxd`)
//! as its users get it: installed with pip into the virtual environment
//! `scripts/lib.sh` `ensure_python_client` makes, type-checked with
//! `mypy --strict`, and its pytest suite run against a real controller and
//! state database, connected as an orchestrator role that sees only its
//! own rows.

use crate::common;

use common::{test_images, TestEnv};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole pytest run (about 15 sandboxes, a few heals) is bounded by this.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The virtual environment's `bin/` (made by `ensure_python_client`).
fn venv_bin() -> PathBuf {
    let bin = repo().join("target/python-client-venv/bin");
    assert!(
        bin.join("pytest").exists() && bin.join("mypy").exists(),
        "the Python client's tests need the virtual environment {} with pytest and mypy: \
         run scripts/test.sh, or `. scripts/lib.sh; ensure_python_client`",
        bin.display()
    );
    bin
}

/// Runs `program args` in `clients/python` with `envs`; panics with its
/// output unless it succeeds. Its standard output.
async fn run(program: &Path, args: &[&str], envs: &[(&str, &str)]) -> String {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(repo().join("clients/python"))
        .env("MYPY_CACHE_DIR", repo().join("target/mypy-cache"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(envs.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} {args:?} did not end within {RUN_TIMEOUT:?}",
                program.display()
            )
        })
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

// Multi-threaded: the controller runs in this process while pytest runs.
#[tokio::test(flavor = "multi_thread")]
async fn the_python_client_installs_type_checks_and_passes_its_tests_against_the_real_controller() {
    let bin = venv_bin();
    // The package as pip installs it from the checkout (no index: its one
    // dependency, psycopg, and setuptools are in the environment already).
    run(
        &bin.join("pip"),
        &[
            "install",
            "--quiet",
            "--no-input",
            "--no-index",
            "--no-build-isolation",
            "--force-reinstall",
            "--no-deps",
            ".",
        ],
        &[],
    )
    .await;
    let typed = run(&bin.join("mypy"), &["--strict"], &[]).await;
    assert!(typed.contains("Success: no issues found"), "{typed}");

    let env = TestEnv::new().await;
    let mut config = env.config();
    // Postgres features from the plain image (contrib, no pgvector): a
    // request for `vector` fails, as the failed-request tests need.
    config.images = sandboxd::config::Images::new(
        &[test_images()],
        &[
            "postgres=sandboxd/postgres:17".to_owned(),
            "redis=sandboxd/redis:8".to_owned(),
        ],
    )
    .unwrap();
    let controller = env.start(config);
    let (_, url) = env.create_login_role("pyclient").await;
    sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY)
        .grant_orchestrator("pyclient", true)
        .await
        .expect("grant-orchestrator");

    let report = run(
        &bin.join("python"),
        &["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"],
        &[
            ("SANDBOXD_TEST_DSN", &url),
            ("SANDBOXD_TEST_DEPLOYMENT", env.deployment.as_str()),
        ],
    )
    .await;
    // Every test ran and passed: none skipped, none deselected.
    let summary = report.lines().last().unwrap_or_default();
    assert!(
        summary.contains("passed") && !summary.contains("skipped") && !summary.contains("failed"),
        "{report}"
    );
    let passed: u32 = summary
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 16, "{report}");
    controller.stop().await;
}
