//! The compose stack (deploy/compose.yaml) as docker-compose resolves it
//! (issue 29, hole 8): it installs the host guard before sandboxd starts,
//! sandboxd joins no sandbox network and serves HTTP on loopback only, and
//! Grafana's admin password comes from a secret file, never a default.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// `docker-compose config` of deploy/compose.yaml with the required
/// variables set, as JSON (through the PyYAML docker-compose itself uses).
fn resolved_compose() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("docker-compose")
        .current_dir(root)
        .args(["-p", "sandboxd", "-f", "deploy/compose.yaml", "config"])
        .env("SANDBOXD_STATE_PASSWORD", "0123abcd")
        .env("SANDBOXD_STATE_ADMIN_PASSWORD", "4567ef01")
        .env_remove("GRAFANA_ADMIN_PASSWORD")
        .output()
        .expect("run docker-compose (Debian: apt-get install docker-compose)");
    assert!(
        out.status.success(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut python = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    use std::io::Write;
    python.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let json = python.wait_with_output().unwrap();
    assert!(json.status.success(), "YAML to JSON failed");
    serde_json::from_slice(&json.stdout).expect("JSON")
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_compose_stack_installs_the_guard_first_keeps_sandboxd_off_sandbox_networks_and_takes_grafanas_password_from_a_secret(
) {
    let compose = resolved_compose();
    let services = &compose["services"];

    // The guard: on the host's network, NET_ADMIN only, kept installed,
    // healthy only once its rules are in; sandboxd waits for that.
    let guard = &services["host-guard"];
    assert_eq!(guard["network_mode"], "host", "{guard}");
    assert_eq!(
        strings(&guard["entrypoint"]),
        ["/usr/local/lib/sandboxd/host-firewall.sh", "--keep"]
    );
    assert!(strings(&guard["healthcheck"]["test"]).contains(&"--check"));
    assert_eq!(strings(&guard["cap_drop"]), ["ALL"]);
    assert!(strings(&guard["cap_add"]).contains(&"NET_ADMIN"));
    assert_ne!(guard["privileged"], true);
    let sandboxd = &services["sandboxd"];
    assert_eq!(
        sandboxd["depends_on"]["host-guard"]["condition"], "service_healthy",
        "sandboxd must wait for the guard: {sandboxd}"
    );
    // The image the guard runs ships the script where the entrypoint says.
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/Dockerfile"))
            .unwrap();
    assert!(dockerfile
        .contains("COPY deploy/host-firewall.sh /usr/local/lib/sandboxd/host-firewall.sh"));
    assert!(dockerfile.contains(" iptables"));

    // sandboxd: the host's network, HTTP on loopback, probes through the
    // host ports: it never joins a sandbox network.
    assert_eq!(sandboxd["network_mode"], "host", "{sandboxd}");
    let env = &sandboxd["environment"];
    let metrics = env["SANDBOXD_METRICS_ADDR"].as_str().unwrap_or_default();
    assert!(metrics.starts_with("127.0.0.1:"), "{metrics}");
    for unset in ["SANDBOXD_PROBE_VIA", "SANDBOXD_CONTROLLER_CONTAINER"] {
        assert!(env.get(unset).is_none(), "{unset} is set: {env}");
    }
    // Nothing listens beyond loopback.
    for (name, service) in services.as_object().unwrap() {
        for port in service["ports"].as_array().into_iter().flatten() {
            let port = port.as_str().unwrap_or_default();
            assert!(port.starts_with("127.0.0.1:"), "{name} publishes {port}");
        }
    }
    let prometheus = strings(&services["prometheus"]["command"]).join(" ");
    assert!(
        prometheus.contains("--web.listen-address=127.0.0.1:"),
        "{prometheus}"
    );
    assert_eq!(
        services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"],
        "127.0.0.1"
    );

    // Grafana: the admin password is the secret's file, never admin/admin.
    let grafana = &services["grafana"];
    let genv = &grafana["environment"];
    assert!(genv.get("GF_SECURITY_ADMIN_PASSWORD").is_none(), "{genv}");
    assert_eq!(
        genv["GF_SECURITY_ADMIN_PASSWORD__FILE"],
        "/run/secrets/grafana_admin_password"
    );
    assert!(grafana["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["source"] == "grafana_admin_password"));
    let file = compose["secrets"]["grafana_admin_password"]["file"]
        .as_str()
        .unwrap();
    assert!(
        file.ends_with("deploy/compose/secrets/grafana-admin-password"),
        "{file}"
    );
}

#[test]
fn the_secrets_script_makes_a_random_grafana_password_once_and_keeps_it() {
    // A copy of the script, so that the repository's secrets stay as they are.
    let dir = std::env::temp_dir().join(format!("sandboxd-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("secrets.sh");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/compose/secrets.sh"),
        &script,
    )
    .unwrap();
    // What an `up` before the script leaves: a directory in the file's place.
    let file = dir.join("secrets/grafana-admin-password");
    std::fs::create_dir_all(&file).unwrap();
    let run = || {
        let out = Command::new("sh").arg(&script).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        std::fs::read_to_string(&file).unwrap()
    };
    let first = run();
    assert_eq!(first.len(), 32, "{first:?}");
    assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first:?}");
    assert_eq!(run(), first, "kept on a second run");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join("secrets")), 0o700);
    assert_eq!(
        mode(&file),
        0o644,
        "Grafana's user reads it in its container"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
