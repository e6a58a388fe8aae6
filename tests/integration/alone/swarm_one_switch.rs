//! The README's Swarm recipe, as an operator runs it on an engine in no
//! Swarm: `SANDBOXD_BACKEND=swarm scripts/run.sh` refuses and names the one
//! variable to set; `SANDBOXD_BACKEND=swarm SANDBOXD_SWARM_INIT=1
//! scripts/run.sh` makes a single-node Swarm (its gateway bridge closed)
//! and runs sandboxd in a container on the sandboxes' overlays, with no
//! other setting. A row becomes ready, served from the recipe's warm pool
//! of services, with nothing published on the host,
//! its agent on the internal overlay logs in and cannot reach the
//! controller's metrics, a killed task is healed with the same password,
//! its data goes back to a checkpoint and to the baseline, a released row
//! leaves no service, secret or network, and a SIGTERM stops the
//! controller's container.

use crate::common;

use common::{cli_at as cli, docker, docker_ok, eventually, free_port, http_get, Process, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What the recipe leaves, removed however the test ends: the controller's
/// container, the state container and volume, the sandboxes' services,
/// the deployment's template volumes, the control network, and the Swarm
/// if the test made it.
struct Session {
    controller: Option<Process>,
    container: String,
    state: String,
    deployment: String,
    home: PathBuf,
    made_swarm: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.signal("TERM");
            drop(controller);
        }
        docker(&["rm", "-f", &self.container]);
        docker(&["rm", "-f", "-v", &self.state]);
        docker(&["volume", "rm", "-f", &self.state]);
        common::remove_swarm_objects(
            &format!("io.sandboxd.deployment={}", self.deployment),
            &format!("io.sandboxd.swarm-deployment={}", self.deployment),
        );
        // The deployment's templates and shared binaries: volumes of the
        // deployment's, kept by sandboxd across restarts, so the test's.
        common::remove_volumes_labelled(&format!("io.sandboxd.deployment={}", self.deployment));
        docker(&["network", "rm", "sandboxd-control"]);
        if self.made_swarm {
            docker(&["swarm", "leave", "--force"]);
            docker(&["network", "rm", "docker_gwbridge"]);
        }
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// `scripts/run.sh ARGS` with the recipe's variables and this test's
/// names (deployment, state and controller containers, state directory).
fn run_sh(session: &Session, init: bool, args: &[&str]) -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(root.join("scripts/run.sh"));
    command
        .args(["--deployment", &session.deployment])
        .args(args)
        .env_remove("DATABASE_URL")
        .env("SANDBOXD_BACKEND", "swarm")
        .env("SANDBOXD_HOME", &session.home)
        .env("SANDBOXD_STATE_CONTAINER", &session.state)
        .env("SANDBOXD_CONTROLLER_CONTAINER", &session.container)
        .env("SANDBOXD_BIN", BIN)
        .stdin(std::process::Stdio::null());
    if init {
        command.env("SANDBOXD_SWARM_INIT", "1");
    }
    command
}

/// Runs `script` in a throwaway container on `network` (the Redis image
/// has redis-cli and bash).
fn on_network(network: &str, script: &str) -> String {
    let out = docker(&[
        "run",
        "--rm",
        "--network",
        network,
        "--entrypoint",
        "bash",
        "sandboxd/redis:8",
        "-c",
        script,
    ]);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_swarm_recipe_starts_a_ready_controller_whose_sandboxes_publish_nothing() {
    let deployment = format!("w{:010x}", rand::random::<u64>() & 0xff_ffff_ffff);
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let swarm_before = docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]);
    let mut session = Session {
        controller: None,
        container: format!("sandboxd-controller-{deployment}"),
        state: format!("sandboxd-state-{deployment}"),
        deployment: deployment.clone(),
        home: std::env::temp_dir().join(format!("sandboxd-swarm-{deployment}")),
        made_swarm: swarm_before != "active",
    };

    if session.made_swarm {
        // In no Swarm and not asked to make one: refused, with the recipe.
        let out = run_sh(&session, false, &[]).output().expect("run.sh");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("SANDBOXD_BACKEND=swarm SANDBOXD_SWARM_INIT=1 scripts/run.sh"),
            "{said}"
        );
        assert_eq!(
            docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]),
            "inactive",
            "nothing was changed"
        );
    }

    session.controller = Some(Process(
        run_sh(
            &session,
            true,
            &["--metrics-addr", &metrics, "--grace", "0s"],
        )
        .spawn()
        .expect("start scripts/run.sh"),
    ));
    eventually(
        "the controller in its container is ready",
        Duration::from_secs(240),
        || async { matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(()) },
    )
    .await;
    assert_eq!(
        docker_ok(&["info", "--format", "{{.Swarm.ControlAvailable}}"]),
        "true"
    );
    if session.made_swarm {
        let options = docker_ok(&[
            "network",
            "inspect",
            "-f",
            "{{json .Options}}",
            "docker_gwbridge",
        ]);
        for closed in [
            "\"com.docker.network.bridge.enable_icc\":\"false\"",
            "\"com.docker.network.bridge.enable_ip_masquerade\":\"false\"",
        ] {
            assert!(options.contains(closed), "{closed} in {options}");
        }
    }
    // The URL with the state database's password is in no environment.
    let env = docker_ok(&["inspect", "-f", "{{json .Config.Env}}", &session.container]);
    assert!(!env.contains("postgres://"), "{env}");

    // The recipe's warm pool (`postgres=2 redis=2`) fills with services.
    eventually(
        "a ready redis pool service",
        Duration::from_secs(120),
        || async {
            let (_, text) = http_get(port, "/metrics").await?;
            (common::sample(
                &text,
                "sandboxd_pool_size{engine=\"redis\",state=\"ready\"}",
            ) >= Some(1.0))
            .then_some(())
        },
    )
    .await;

    let id = "swarm-recipe";
    let out = cli(
        &session.home,
        &["apply", "--id", id, "--services", "redis", "--wait", "120s"],
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON status");
    assert_eq!(status["phase"], "ready", "{status}");
    let redis = &status["services"]["redis"];
    assert_eq!(redis["host_port"], 0, "nothing published: {status}");
    let password = redis["password"].as_str().unwrap().to_owned();
    let services = docker_ok(&[
        "service",
        "ls",
        "--filter",
        &format!("label=io.sandboxd.sandbox={id}"),
        "--format",
        "{{.Name}} {{.Ports}}",
    ]);
    assert_eq!(services.lines().count(), 1, "{services}");
    assert!(!services.contains("->"), "no port published: {services}");
    // Served from the recipe's warm pool: the claimed pool service carries
    // the sandbox's labels now, and the sandbox adopted its overlay.
    assert!(
        services.starts_with("sandboxd-pool-"),
        "a pool service claimed: {services}"
    );
    let network = status["network"]
        .as_str()
        .expect("the status names its network");
    let overlay = docker_ok(&[
        "network",
        "ls",
        "--filter",
        &format!("label=io.sandboxd.name={network}"),
        "--format",
        "{{.Name}}",
    ]);
    assert_eq!(
        docker_ok(&["network", "inspect", "-f", "{{.Internal}}", &overlay]),
        "true"
    );

    // An agent on the overlay: its engine answers by name with the
    // password; the controller, also on the overlay, serves nothing there.
    let controller_ip = docker_ok(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{overlay}\").IPAddress}}}}"),
        &session.container,
    ]);
    let said = on_network(
        &overlay,
        &format!(
            "redis-cli -h redis -a {password} --no-auth-warning ping; \
             timeout 3 bash -c 'exec 3<>/dev/tcp/{controller_ip}/9187' && echo METRICS-OPEN || echo metrics-closed"
        ),
    );
    assert!(said.contains("PONG"), "{said}");
    assert!(said.contains("metrics-closed"), "{said}");

    // A task killed from outside: healed with the same password.
    let task = docker_ok(&[
        "ps",
        "-q",
        "--filter",
        &format!(
            "label=com.docker.swarm.service.name={}",
            services.split(' ').next().unwrap()
        ),
    ]);
    docker_ok(&["kill", &task]);
    let healed = eventually("the killed task is healed", Duration::from_secs(90), || {
        let out = cli(&session.home, &["get", id, "--output", "json"]);
        async move {
            let s: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            (s["phase"] == "ready" && s["services"]["redis"]["heals"] == 1).then_some(s)
        }
    })
    .await;
    assert_eq!(healed["services"]["redis"]["password"], password.as_str());
    // The new task answers by name once the overlay has it (moments after
    // it is ready: CI once saw "Network is unreachable" right after).
    let said = eventually(
        "the healed task answers with the same password",
        Duration::from_secs(30),
        || {
            let said = on_network(
                &overlay,
                &format!("redis-cli -h redis -a {password} --no-auth-warning ping"),
            );
            async move { said.contains("PONG").then_some(said) }
        },
    )
    .await;
    assert!(said.contains("PONG"), "{said}");

    // A checkpoint and a reset, through the task's container on this node.
    let redis = |command: &str| {
        on_network(
            &overlay,
            &format!("redis-cli -h redis -a {password} --no-auth-warning {command}"),
        )
    };
    assert!(redis("SET k before").contains("OK"));
    cli(&session.home, &["checkpoint", id, "one", "--wait"]);
    assert!(redis("SET k after").contains("OK"));
    cli(&session.home, &["reset", id, "one", "--wait"]);
    assert_eq!(redis("GET k").trim(), "before", "back to the checkpoint");
    cli(&session.home, &["reset", id, "--wait"]);
    assert_eq!(redis("EXISTS k").trim(), "0", "back to the empty baseline");

    // Released: its services (the claimed one and its heal's), their
    // secrets and its overlay go.
    cli(&session.home, &["delete", id]);
    let label = format!("label=io.sandboxd.sandbox={id}");
    let claimed = format!(
        "label=io.sandboxd.swarm-service={}",
        services.split(' ').next().unwrap()
    );
    eventually(
        "the released sandbox's service, secret and overlay go",
        Duration::from_secs(60),
        || {
            let left = [
                docker(&["service", "ls", "-q", "--filter", &label]).stdout,
                docker(&[
                    "network",
                    "ls",
                    "-q",
                    "--filter",
                    &format!("name=^{overlay}$"),
                ])
                .stdout,
                docker(&["secret", "ls", "-q", "--filter", &label]).stdout,
                docker(&["secret", "ls", "-q", "--filter", &claimed]).stdout,
            ];
            async move { left.iter().all(|o| o.is_empty()).then_some(()) }
        },
    )
    .await;

    // A SIGTERM to run.sh stops the controller and its container goes.
    session.controller.as_ref().unwrap().signal("TERM");
    let container = session.container.clone();
    eventually(
        "the controller's container goes",
        Duration::from_secs(60),
        || {
            let out = docker(&["ps", "-aq", "--filter", &format!("name=^{container}$")]);
            async move { out.stdout.is_empty().then_some(()) }
        },
    )
    .await;
}
