//! The engine images read their password from a file when
//! `SANDBOXD_SECRETS_FILE` names one: how a Docker Swarm service receives a
//! Swarm secret (a file under `/run/secrets/`, owned by the uid the service
//! names, never in `docker service inspect`), the first step of the Swarm
//! backend (docs/swarm.md). Plain Docker stands in for Swarm here: the file
//! is bind-mounted where Swarm mounts secrets, owned by the engine's uid,
//! mode 0400; everything else is the container sandboxd would create (its
//! user, read-only root, tmpfs, no capabilities, environment, command).

use crate::common;

use common::{engine_container_spec, eventually, sandbox_id};
use sandboxd::engine::Credentials;
use sandboxd::ports::runtime::ContainerSpec;
use sqlx::Connection;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

/// Where Swarm mounts a secret called `sandboxd`.
const SECRET_PATH: &str = "/run/secrets/sandboxd";

/// The container sandboxd would create for `engine`, under a name of its
/// own, and its credentials.
fn spec_of(engine: &str) -> (ContainerSpec, Credentials) {
    let name = format!("sandboxd-secrets-file-{}", sandbox_id(engine));
    engine_container_spec(engine, &name)
}

/// A container removed when dropped, even after a failed assertion.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.0])
            .output();
    }
}

/// A directory removed when dropped.
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `docker run` arguments for `spec` as sandboxd's Docker adapter sets it
/// up, without standard input, the secret file `secret` (a host path)
/// mounted at [`SECRET_PATH`] and `SANDBOXD_SECRETS_FILE` set to `named`.
fn run_args(spec: &ContainerSpec, secret: Option<&std::path::Path>, named: &str) -> Vec<String> {
    let owner = spec.user.replace(':', ",gid=");
    let mut args: Vec<String> = vec![
        "--name".into(),
        spec.name.clone(),
        "--user".into(),
        spec.user.clone(),
        "--read-only".into(),
        "--cap-drop".into(),
        "ALL".into(),
        "--security-opt".into(),
        "no-new-privileges:true".into(),
        "--memory".into(),
        spec.limits.memory_bytes.to_string(),
        "-p".into(),
        format!("127.0.0.1::{}", spec.port),
        "-e".into(),
        format!("SANDBOXD_SECRETS_FILE={named}"),
    ];
    for t in &spec.tmpfs {
        args.push("--tmpfs".into());
        args.push(format!(
            "{}:rw,noexec,nosuid,nodev,size={},uid={owner}",
            t.path, t.bytes
        ));
    }
    for e in &spec.env {
        args.push("-e".into());
        args.push(e.clone());
    }
    if let Some(file) = secret {
        args.push("-v".into());
        args.push(format!("{}:{SECRET_PATH}:ro", file.display()));
    }
    let mut cmd = spec.cmd.clone();
    if let Some(entrypoint) = &spec.entrypoint {
        args.push("--entrypoint".into());
        args.push(entrypoint[0].clone());
        cmd = entrypoint[1..].iter().cloned().chain(cmd).collect();
    }
    args.push(spec.image.clone());
    args.extend(cmd);
    args
}

/// Writes what sandboxd would write to the container's standard input to
/// a file owned by the container's uid, mode 0400, in a directory of its own.
fn secret_file(spec: &ContainerSpec) -> (Dir, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("{}-secret", spec.name));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sandboxd");
    let content = spec.stdin.as_ref().expect("secrets for standard input");
    std::fs::write(&file, content.expose()).unwrap();
    let (uid, gid) = spec.user.split_once(':').expect("uid:gid");
    let status = Command::new("chown")
        .args([&format!("{uid}:{gid}"), file.to_str().unwrap()])
        .status()
        .expect("chown");
    assert!(status.success(), "chown the secret file to {uid}:{gid}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
    (Dir(dir), file)
}

/// Starts `spec` detached with its secrets in a file; the container, its
/// published host port and the secret file's directory.
fn start_with_secret_file(spec: &ContainerSpec) -> (Container, u16, Dir) {
    let (dir, file) = secret_file(spec);
    let out = Command::new("docker")
        .arg("run")
        .arg("-d")
        .args(run_args(spec, Some(&file), SECRET_PATH))
        .output()
        .expect("docker run");
    let container = Container(spec.name.clone());
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = Command::new("docker")
        .args(["port", &spec.name, &spec.port.to_string()])
        .output()
        .expect("docker port");
    let port = String::from_utf8_lossy(&port.stdout)
        .lines()
        .find_map(|l| l.rsplit_once(':')?.1.trim().parse().ok())
        .expect("a published port");
    (container, port, dir)
}

/// What `docker inspect` says about the container, whole.
fn inspect(name: &str) -> String {
    let out = Command::new("docker")
        .args(["inspect", name])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `spec` in the foreground with `SANDBOXD_SECRETS_FILE` set to
/// `named` and nothing mounted there: its exit code and standard error.
fn refused(spec: &ContainerSpec, named: &str) -> (Option<i32>, String) {
    let out = Command::new("docker")
        .args(["run", "--rm"])
        .args(run_args(spec, None, named))
        .output()
        .expect("docker run");
    let _cleanup = Container(spec.name.clone());
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_postgres_container_takes_its_password_from_a_secret_file_and_nothing_else_holds_it() {
    let (spec, credentials) = spec_of("postgres");
    let (container, port, _dir) = start_with_secret_file(&spec);
    let url = format!(
        "postgres://{}:{}@127.0.0.1:{port}/{}",
        credentials.user,
        credentials.password.expose(),
        credentials.database
    );
    let mut conn = eventually(
        "postgres answers with the file's password",
        Duration::from_secs(60),
        || async { sqlx::PgConnection::connect(&url).await.ok() },
    )
    .await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let wrong = format!(
        "postgres://{}:wrong-password@127.0.0.1:{port}/{}",
        credentials.user, credentials.database
    );
    assert!(
        sqlx::PgConnection::connect(&wrong).await.is_err(),
        "another password is refused"
    );
    let inspected = inspect(&container.0);
    assert!(inspected.contains("SANDBOXD_SECRETS_FILE=/run/secrets/sandboxd"));
    assert!(
        !inspected.contains(credentials.password.expose()),
        "the password is in the file only"
    );
}

#[tokio::test]
async fn a_redis_container_takes_its_password_from_a_secret_file_and_nothing_else_holds_it() {
    let (spec, credentials) = spec_of("redis");
    let (container, port, _dir) = start_with_secret_file(&spec);
    let url = format!(
        "redis://:{}@127.0.0.1:{port}/0",
        credentials.password.expose()
    );
    let client = redis::Client::open(url).unwrap();
    let mut conn = eventually(
        "redis answers with the file's password",
        Duration::from_secs(60),
        || async { client.get_multiplexed_async_connection().await.ok() },
    )
    .await;
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    let wrong = redis::Client::open(format!("redis://:wrongpassword@127.0.0.1:{port}/0")).unwrap();
    assert!(
        wrong.get_multiplexed_async_connection().await.is_err(),
        "another password is refused"
    );
    assert!(
        !inspect(&container.0).contains(credentials.password.expose()),
        "the password is in the file only"
    );
}

#[tokio::test]
async fn a_secrets_file_outside_run_secrets_or_missing_is_refused_before_anything_starts() {
    let cases = [
        (
            "/etc/passwd",
            "SANDBOXD_SECRETS_FILE must name a file under /run/secrets/",
        ),
        (
            "/run/secrets/../../etc/passwd",
            "must name a file under /run/secrets/",
        ),
        (SECRET_PATH, "which is not a file uid 999 can read"),
    ];
    for engine in ["postgres", "redis"] {
        for (path, message) in cases {
            let (spec, _) = spec_of(engine);
            let (code, stderr) = refused(&spec, path);
            assert_eq!(code, Some(64), "{engine}, {path}: {stderr}");
            assert!(stderr.contains(message), "{engine}, {path}: {stderr}");
        }
    }
}
