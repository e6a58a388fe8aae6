//! The engine images run as hardened Docker Swarm services, the way the
//! Swarm backend's design (docs/swarm.md) has them: one replica, the
//! engine's uid, a read-only root, no capability, data and runtime
//! directories on local volumes with tmpfs options (a service's own tmpfs
//! mount is root-owned on this engine), the password from a Swarm secret
//! mounted as a file (`SANDBOXD_SECRETS_FILE`), reached by name on an
//! attachable overlay with DNS round-robin endpoints (no IPVS here). The
//! backend itself is not built yet: this pins what it will stand on.
//!
//! The test joins a single-node Swarm it creates on the engine it uses
//! (`docker swarm init --advertise-addr 127.0.0.1`) and leaves it again,
//! unless the engine already was in a Swarm, which it then leaves alone.

use crate::common;

use common::{docker, docker_ok, engine_container_spec, remove_swarm_objects, sandbox_id};
use sandboxd::ports::runtime::ContainerSpec;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Label on everything this test creates.
const LABEL: &str = "io.sandboxd.test-swarm";

/// A single-node Swarm for the test's length: left (and the bridge Swarm
/// mode adds removed) when dropped, if this test created it.
struct Swarm {
    created: bool,
}

impl Swarm {
    fn join() -> Self {
        let state = docker_ok(&["info", "--format", "{{.Swarm.LocalNodeState}}"]);
        if state == "active" {
            return Swarm { created: false };
        }
        docker_ok(&["swarm", "init", "--advertise-addr", "127.0.0.1"]);
        Swarm { created: true }
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        if self.created {
            docker(&["swarm", "leave", "--force"]);
            docker(&["network", "rm", "docker_gwbridge"]);
        }
    }
}

/// Removes what the test created.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let label = format!("{LABEL}={}", self.0);
        remove_swarm_objects(&label, &label);
    }
}

/// Creates the secret, the overlay and the one-replica service for `spec`
/// as the design has it; the service's name is `spec.name`, reachable as
/// `alias` on the overlay `network`.
fn create_service(spec: &ContainerSpec, run: &str, network: &str, alias: &str) {
    let label = format!("{LABEL}={run}");
    let mut child = Command::new("docker")
        .args(["secret", "create", "--label", &label, &spec.name, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("docker secret create");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.stdin.as_ref().expect("secrets").expose().as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "docker secret create");
    let (uid, gid) = spec.user.split_once(':').expect("uid:gid");
    let mut args: Vec<String> = [
        "service",
        "create",
        "--quiet",
        "--detach",
        "--no-resolve-image",
        "--name",
        &spec.name,
        "--label",
        &label,
        "--container-label",
        &label,
        "--replicas",
        "1",
        "--restart-condition",
        "none",
        "--user",
        &spec.user,
        "--read-only",
        "--cap-drop",
        "ALL",
        "--limit-memory",
        &spec.limits.memory_bytes.to_string(),
        "--endpoint-mode",
        "dnsrr",
        "--network",
        &format!("name={network},alias={alias}"),
        "--secret",
        &format!(
            "source={},target=sandboxd,uid={uid},gid={gid},mode=0400",
            spec.name
        ),
        "--env",
        "SANDBOXD_SECRETS_FILE=/run/secrets/sandboxd",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (i, t) in spec.tmpfs.iter().enumerate() {
        args.push("--mount".into());
        args.push(format!(
            "type=volume,source={}-{i},dst={},volume-label={label},volume-driver=local,\
             volume-opt=type=tmpfs,volume-opt=device=tmpfs,\
             \"volume-opt=o=size={},uid={uid},gid={gid},mode=0700,noexec,nosuid,nodev\"",
            spec.name, t.path, t.bytes
        ));
    }
    for e in &spec.env {
        args.push("--env".into());
        args.push(e.clone());
    }
    // Postgres and Redis keep their images' entrypoints (only Mongo's is
    // replaced, and it is not run here).
    assert!(spec.entrypoint.is_none(), "{}: an entrypoint", spec.name);
    args.push(spec.image.clone());
    args.extend(spec.cmd.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    docker_ok(&args);
}

/// Runs `cmd` in a throwaway container of `image` on the overlay `network`
/// with `env`; its exit success and output.
fn on_overlay(
    run: &str,
    network: &str,
    image: &str,
    env: &[String],
    cmd: &[&str],
) -> (bool, String) {
    let label = format!("{LABEL}={run}");
    let mut args = vec!["run", "--rm", "--label", &label, "--network", network];
    for e in env {
        args.push("--env");
        args.push(e);
    }
    args.push(image);
    args.extend(cmd);
    let out = docker(&args);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Polls `check` every half second until it holds or `within` passes.
fn within(what: &str, within: Duration, mut check: impl FnMut() -> (bool, String)) {
    let deadline = Instant::now() + within;
    loop {
        let (ok, last) = check();
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; last: {last}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every inspect of the service and its task's container, whole.
fn inspected(service: &str) -> String {
    let mut all = docker_ok(&["service", "inspect", service]);
    let tasks = docker_ok(&["service", "ps", "-q", "--no-trunc", service]);
    for task in tasks.lines() {
        all.push_str(&docker_ok(&["inspect", "--type", "task", task]));
    }
    let containers = docker_ok(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=com.docker.swarm.service.name={service}"),
    ]);
    for c in containers.lines() {
        all.push_str(&docker_ok(&["inspect", c]));
    }
    all
}

#[test]
fn postgres_and_redis_run_as_hardened_swarm_services_with_their_passwords_from_swarm_secrets() {
    let _swarm = Swarm::join();
    let run = sandbox_id("swarm").to_string();
    let _cleanup = Cleanup(run.clone());
    let network = format!("{run}-net");
    docker_ok(&[
        "network",
        "create",
        "--driver",
        "overlay",
        "--attachable",
        "--label",
        &format!("{LABEL}={run}"),
        &network,
    ]);
    let (pg, pg_credentials) = engine_container_spec("postgres", &format!("{run}-postgres"));
    let (redis, redis_credentials) = engine_container_spec("redis", &format!("{run}-redis"));
    let pg_password = pg_credentials.password.expose().to_owned();
    let redis_password = redis_credentials.password.expose().to_owned();
    create_service(&pg, &run, &network, "postgres");
    create_service(&redis, &run, &network, "redis");

    // An agent on the overlay reaches both by name with the passwords
    // (given to its clients through their environment variables).
    let image = redis.image.clone();
    within(
        "redis answers on the overlay",
        Duration::from_secs(90),
        || {
            let (ok, out) = on_overlay(
                &run,
                &network,
                &image,
                &[format!("REDISCLI_AUTH={redis_password}")],
                &["redis-cli", "-h", "redis", "ping"],
            );
            (ok && out.contains("PONG"), out)
        },
    );
    let (ok, out) = on_overlay(
        &run,
        &network,
        &image,
        &["REDISCLI_AUTH=wrongpassword".to_owned()],
        &["redis-cli", "-h", "redis", "ping"],
    );
    assert!(
        !out.contains("PONG"),
        "another password is refused: {ok} {out}"
    );
    let user = pg_credentials.user.as_str();
    within(
        "postgres answers on the overlay",
        Duration::from_secs(90),
        || {
            let (ok, out) = on_overlay(
                &run,
                &network,
                &pg.image,
                &[format!("PGPASSWORD={pg_password}")],
                &[
                    "psql",
                    "-h",
                    "postgres",
                    "-U",
                    user,
                    "-d",
                    &pg_credentials.database,
                    "-tAc",
                    "select current_user",
                ],
            );
            (ok && out.trim() == user, out)
        },
    );

    // The services run as the engine's uid with nothing added, read-only.
    for spec in [&pg, &redis] {
        let config = docker_ok(&[
            "service",
            "inspect",
            &spec.name,
            "--format",
            "{{json .Spec.TaskTemplate.ContainerSpec.User}} {{.Spec.TaskTemplate.ContainerSpec.ReadOnly}} {{json .Spec.TaskTemplate.ContainerSpec.CapabilityDrop}}",
        ]);
        assert_eq!(
            config,
            format!("\"{}\" true [\"ALL\"]", spec.user),
            "{}",
            spec.name
        );
        // No credential in any inspect.
        let all = inspected(&spec.name);
        assert!(all.contains("/run/secrets/sandboxd") || all.contains("SANDBOXD_SECRETS_FILE"));
        for password in [&pg_password, &redis_password] {
            assert!(
                !all.contains(password.as_str()),
                "{}: a password in an inspect",
                spec.name
            );
        }
    }
}
