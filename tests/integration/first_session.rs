//! A new user's first session, the README's way: `scripts/run.sh` starts
//! the controller and its own state database (in a state directory of its
//! own), and the CLI finds that database with no `--database-url` and no
//! `DATABASE_URL`: `list`, `apply --wait`, a `psql` login to the sandbox,
//! `describe`, `delete`.

use crate::common;

use common::{cli_at as cli, eventually, free_port, http_get, Process, BIN};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// What `run.sh` leaves on the machine, removed when the test ends however
/// it ends: the controller, its state container and volume, the sandboxes.
struct Session {
    controller: Option<Process>,
    state: String,
    deployment: String,
    home: PathBuf,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.signal("TERM");
            drop(controller);
        }
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.state])
            .output();
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f", &self.state])
            .output();
        let label = format!("io.sandboxd.deployment={}", self.deployment);
        common::remove_containers_labelled(&label);
        common::remove_networks_labelled(&label);
        common::remove_volumes_labelled(&label);
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// Multi-threaded: the test blocks on child processes.
#[tokio::test(flavor = "multi_thread")]
async fn run_sh_starts_a_controller_whose_database_the_cli_finds_without_a_flag_or_variable() {
    let deployment = format!("t{:010x}", rand::random::<u64>() & 0xff_ffff_ffff);
    let home = std::env::temp_dir().join(format!("sandboxd-first-session-{deployment}"));
    let port = free_port();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut session = Session {
        controller: None,
        state: format!("sandboxd-state-{deployment}"),
        deployment: deployment.clone(),
        home: home.clone(),
    };
    let metrics = format!("127.0.0.1:{port}");
    session.controller = Some(Process(
        Command::new(root.join("scripts/run.sh"))
            .args(["--deployment", &deployment, "--metrics-addr", &metrics])
            // Released sandboxes go at once (the default waits 180 s).
            .args(["--grace", "0s"])
            .env_remove("DATABASE_URL")
            .env("SANDBOXD_HOME", &home)
            .env("SANDBOXD_STATE_CONTAINER", &session.state)
            .env("SANDBOXD_BIN", BIN)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start scripts/run.sh"),
    ));

    let url_file = home.join("database-url");
    eventually(
        "run.sh records the URL and sandboxd is ready",
        Duration::from_secs(240),
        || {
            let recorded = url_file.exists();
            async move {
                let ready = matches!(http_get(port, "/readyz").await, Some((200, _)));
                (recorded && ready).then_some(())
            }
        },
    )
    .await;
    let mode = std::fs::metadata(&url_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the user reads the URL file");

    let out = cli(&home, &["-v", "list"]);
    assert!(stdout(&out).starts_with("ID"), "{}", stdout(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&url_file.display().to_string()),
        "-v names the file: {said}"
    );

    let id = "first-session";
    let out = cli(
        &home,
        &[
            "apply",
            "--id",
            id,
            "--services",
            "postgres",
            "--wait",
            "120s",
        ],
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON status");
    assert_eq!(status["phase"], "ready", "{status}");
    let pg = &status["services"]["postgres"];
    let login = format!(
        "postgres://{}:{}@127.0.0.1:{}/{}",
        pg["user"].as_str().unwrap(),
        pg["password"].as_str().unwrap(),
        pg["host_port"],
        pg["database"].as_str().unwrap()
    );
    let psql = Command::new("psql")
        .args([login.as_str(), "-XAtc", "SELECT current_user"])
        .output()
        .expect("psql is installed (scripts/test.sh installs Debian's postgresql-client)");
    assert!(
        psql.status.success(),
        "{}",
        String::from_utf8_lossy(&psql.stderr)
    );
    assert_eq!(stdout(&psql).trim(), pg["user"].as_str().unwrap());

    let listing = stdout(&cli(&home, &["list"]));
    let line = listing
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("{id} in:\n{listing}"));
    assert!(
        line.contains("ready") && line.contains("postgres"),
        "{line}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&cli(&home, &["list", "--output", "json"]).stdout).expect("JSON");
    assert!(json
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["id"] == id && e["phase"] == "ready"));

    let described = stdout(&cli(&home, &["describe", id]));
    assert!(described.contains("Phase:        ready"), "{described}");
    // run.sh keeps a small warm pool: the sandbox was claimed from it, or
    // created when the pool was still filling.
    assert!(
        described.contains("claimed [pool]") || described.contains("provisioned ["),
        "{described}"
    );
    assert!(
        !described.contains(pg["password"].as_str().unwrap()),
        "{described}"
    );

    let out = cli(&home, &["delete", id]);
    assert!(stdout(&out).contains("released"), "{}", stdout(&out));
    let label = format!("label=io.sandboxd.sandbox={id}");
    let filter = format!("label=io.sandboxd.deployment={deployment}");
    eventually(
        "the sandbox's containers go",
        Duration::from_secs(60),
        || {
            let out = Command::new("docker")
                .args(["ps", "-aq", "--filter", &label, "--filter", &filter])
                .output()
                .unwrap();
            async move { out.stdout.is_empty().then_some(()) }
        },
    )
    .await;
    // The reconcile records its events once it is done, just after the
    // container went.
    eventually("describe lists the reap", Duration::from_secs(30), || {
        let described = stdout(&cli(&home, &["describe", id]));
        async move { described.contains("reaped [deleted]").then_some(()) }
    })
    .await;
    drop(session);
}
