//! Forks (`BENCH_ONLY=fork`): a fork of a Postgres sandbox holding a
//! ~100 MiB table, from `Client::fork` until the fork is ready, next to
//! two floors measured in the same run and alternating with it:
//!
//! - the checkpoint path: one `docker exec` of psql copying the agent's
//!   database in the source's own cluster (`CREATE DATABASE ... TEMPLATE
//!   ... STRATEGY FILE_COPY`, what `sandbox_checkpoint` does), the least a
//!   copy of this size costs on this machine, without a new container;
//! - a new sandbox: request to ready of an empty Postgres sandbox from the
//!   engine's template (no pool), the least a new container costs;
//! - a bare start from a copy: `docker run` of the engine image (no
//!   sandboxd, no network of its own, no credentials) that copies a copy of
//!   the source's data directory, taken once, from a volume into its tmpfs
//!   and starts the server on it, until `pg_isready` answers in it: the
//!   least a fork with a container of its own costs here once its copy
//!   exists.
//!
//! A fork pays all of them: the copy (with the source frozen) and a start
//! from the copy. Each fork is released, and gone, before the next.

use super::{common, median, start_controller, templates_built, Bench, READY_TIMEOUT};
use sandboxd::client::SandboxRequest;
use sandboxd::config::ControllerConfig;
use sqlx::Connection;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// What one run measured.
struct Forks {
    /// The source database's size.
    bytes: i64,
    /// The checkpoint path's copy.
    checkpoint: Vec<Duration>,
    /// An empty sandbox from the template.
    fresh: Vec<Duration>,
    /// A bare container started from a copy of the source's data.
    bare: Vec<Duration>,
    /// `Client::fork` to ready.
    fork: Vec<Duration>,
}

fn postgres() -> SandboxRequest {
    SandboxRequest {
        owner: "bench".into(),
        services: vec!["postgres".into()],
        ..Default::default()
    }
}

/// Releases `id` and waits until nothing of it is left.
async fn release(bench: &Bench, id: &sandboxd::domain::SandboxId) {
    bench.client.release(id).await.expect("release");
    common::eventually("teardown", READY_TIMEOUT, || async {
        let status = bench.client.status(id).await.expect("status");
        let containers = bench.env.containers(Some(id)).await;
        (status.is_none() && containers.is_empty()).then_some(())
    })
    .await;
}

/// The controller configuration: templates on, no pool, a memory cap
/// that holds a 100 MiB table and a copy of it.
fn config(base: &ControllerConfig) -> ControllerConfig {
    let mut c = base.clone();
    c.templates = true;
    c.warm_pool = Default::default();
    c.warm_pool_demand = sandboxd::config::PoolDemand::off();
    c.limits.memory_bytes = 768 * 1024 * 1024;
    c.limits.tmpfs_bytes = 768 * 1024 * 1024;
    c
}

/// The comparison, as a markdown section.
pub(super) async fn compare(bench: &Bench, iters: usize) -> String {
    let controller = start_controller(&bench.env, config(&bench.config)).await;
    let src = common::sandbox_id("bench-fork-src");
    let status = bench
        .client
        .provision(&src, &postgres(), READY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("sandbox {src}: {e}"));
    templates_built(&controller, 1.0).await;
    let url = common::host_pg_url(&status.services["postgres"]);
    let mut con = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query(
        "CREATE TABLE big AS SELECT g AS id, md5(g::text) || repeat('x', 60) AS v FROM generate_series(1, 750000) g",
    )
    .execute(&mut con)
    .await
    .expect("fill");
    let bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&mut con)
        .await
        .expect("size");
    con.close().await.expect("close");
    let container =
        sandboxd::domain::network::container_name(&bench.config.deployment, &src, engine().name());
    let psql = |sql: &str| {
        format!(
            "psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -U postgres -d template1 -c '{sql}'"
        )
    };
    let mut out = Forks {
        bytes,
        checkpoint: Vec::new(),
        fresh: Vec::new(),
        bare: Vec::new(),
        fork: Vec::new(),
    };
    let image = bench.config.images.image_for(engine(), false);
    let copy = bare_copy(&container, &image).await;
    for i in 0..iters {
        // The checkpoint path.
        let t0 = Instant::now();
        let (code, text) = common::exec_in(
            &bench.env,
            &container,
            &psql("CREATE DATABASE bench_floor TEMPLATE sandbox STRATEGY FILE_COPY"),
            Vec::new(),
        )
        .await;
        out.checkpoint.push(t0.elapsed());
        assert_eq!(code, 0, "checkpoint-path copy: {text}");
        let (code, text) = common::exec_in(
            &bench.env,
            &container,
            &psql("DROP DATABASE bench_floor"),
            Vec::new(),
        )
        .await;
        assert_eq!(code, 0, "drop the copy: {text}");
        out.bare.push(bare_start(&copy, &image).await);
        // A new, empty sandbox, and the fork, in alternating order.
        let fresh = async {
            let id = common::sandbox_id("bench-fresh");
            let t0 = Instant::now();
            bench
                .client
                .provision(&id, &postgres(), READY_TIMEOUT)
                .await
                .unwrap_or_else(|e| panic!("sandbox {id}: {e}"));
            let took = t0.elapsed();
            release(bench, &id).await;
            took
        };
        let fork = async {
            let id = common::sandbox_id("bench-fork");
            let t0 = Instant::now();
            let revision = bench.client.fork(&src, &id, None).await.expect("fork");
            bench
                .client
                .wait_ready(&id, &revision, READY_TIMEOUT)
                .await
                .unwrap_or_else(|e| panic!("fork {id}: {e}"));
            let took = t0.elapsed();
            release(bench, &id).await;
            took
        };
        if i % 2 == 0 {
            out.fresh.push(fresh.await);
            out.fork.push(fork.await);
        } else {
            out.fork.push(fork.await);
            out.fresh.push(fresh.await);
        }
        eprintln!(
            "bench: fork #{}: checkpoint path {:?}, new sandbox {:?}, bare start {:?}, fork {:?}",
            i + 1,
            out.checkpoint[i],
            out.fresh[i],
            out.bare[i],
            out.fork[i]
        );
    }
    docker(&["volume", "rm", "-f", &copy]).await;
    release(bench, &src).await;
    controller.stop().await;
    report(&out)
}

fn engine() -> &'static dyn sandboxd::engine::Engine {
    sandboxd::engine::lookup("postgres").expect("postgres")
}

/// Runs `docker args`, which must succeed: its output.
async fn docker(args: &[&str]) -> String {
    let out = tokio::process::Command::new("docker")
        .args(args)
        .output()
        .await
        .expect("docker runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A volume holding a copy of `source`'s data directory, taken as a fork
/// takes it (a CHECKPOINT, then with the source frozen, by a container of
/// `image` in its PID namespace as its user): the volume's name.
async fn bare_copy(source: &str, image: &str) -> String {
    let volume = format!("bench-fork-floor-{}", std::process::id());
    let data = engine().data_path();
    // Mounted where the image has a directory of its user's (the
    // template's), whose owner an empty volume takes.
    let dir = engine().template_dir().expect("a template dir");
    docker(&["volume", "create", &volume]).await;
    docker(&[
        "exec",
        source,
        "psql",
        "-X",
        "-q",
        "-h",
        "/var/run/postgresql",
        "-U",
        "postgres",
        "-d",
        "template1",
        "-c",
        "CHECKPOINT",
    ])
    .await;
    docker(&["pause", source]).await;
    let copy = format!(
        "tar -C /proc/1/root{data} --exclude=./postmaster.pid --exclude=./postmaster.opts -cf - . | tar -C {dir} -xf -"
    );
    let copied = tokio::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--pid",
            &format!("container:{source}"),
            "--user",
            engine().user(),
            "-v",
            &format!("{volume}:{dir}"),
            "--entrypoint",
            "bash",
            image,
            "-c",
            &copy,
        ])
        .output()
        .await
        .expect("docker runs");
    docker(&["unpause", source]).await;
    assert!(
        copied.status.success(),
        "the floor's copy: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    volume
}

/// `docker run` of `image` that copies the copy in `volume` into its tmpfs
/// and starts the server on it: the time until `pg_isready` answers in it
/// (asked with `docker exec`, as often as it returns).
async fn bare_start(volume: &str, image: &str) -> Duration {
    let name = format!("bench-fork-floor-{}", std::process::id());
    let data = engine().data_path();
    let user = engine().user();
    let dir = engine().template_dir().expect("a template dir");
    let start = format!(
        "tar -C {dir} -cf - . | tar -C {data} -xf - && exec postgres -D {data} -c listen_addresses=127.0.0.1"
    );
    let t0 = Instant::now();
    docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--label",
        "io.sandboxd.bench=1",
        "--user",
        user,
        "--tmpfs",
        &format!("{data}:uid=999,gid=999,mode=0700,size=768m"),
        "--tmpfs",
        "/var/run/postgresql:uid=999,gid=999",
        "-v",
        &format!("{volume}:{dir}:ro"),
        "--entrypoint",
        "bash",
        image,
        "-c",
        &start,
    ])
    .await;
    loop {
        let ready = tokio::process::Command::new("docker")
            .args(["exec", &name, "pg_isready", "-q", "-h", "127.0.0.1"])
            .status()
            .await
            .expect("docker runs");
        if ready.success() {
            break;
        }
        assert!(
            t0.elapsed() < READY_TIMEOUT,
            "the bare start never answered"
        );
    }
    let took = t0.elapsed();
    docker(&["rm", "-f", &name]).await;
    took
}

fn report(r: &Forks) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## Fork\n");
    let _ = writeln!(
        md,
        "A Postgres sandbox holding a table, {:.0} MiB in all, forked: `Client::fork` until the \
         fork is ready (the row, NOTIFY, the reconcile, a helper container next to the source's \
         processes, started while the source runs a CHECKPOINT, the copy with the source frozen, a container started from the \
         copy with fresh credentials, the client's wait). Floors from the same run, alternating \
         with it: the checkpoint path (one `docker exec` of psql copying the database in the \
         source's own cluster, `CREATE DATABASE ... STRATEGY FILE_COPY`), a new empty sandbox \
         from the template, and a bare start from a copy (`docker run` of the engine image, no \
         sandboxd: the copy of the source's data directory, taken once, from a volume into its \
         tmpfs, then the server, until `pg_isready` answers in it). Target: p50 under 300 ms.\n",
        r.bytes as f64 / (1024.0 * 1024.0)
    );
    let _ = writeln!(md, "| | p50 s | max s | n |");
    let _ = writeln!(md, "|---|---:|---:|---:|");
    for (name, times) in [
        ("floor: the checkpoint path's copy", &r.checkpoint),
        ("floor: a new empty sandbox (template)", &r.fresh),
        ("floor: a bare container started from a copy", &r.bare),
        ("sandboxd: fork", &r.fork),
    ] {
        let max = times.iter().max().copied().unwrap_or_default();
        let _ = writeln!(
            md,
            "| {name} | {:.3} | {:.3} | {} |",
            median(times).as_secs_f64(),
            max.as_secs_f64(),
            times.len()
        );
    }
    let fork = median(&r.fork).as_secs_f64();
    let met = if fork < 0.3 { "met" } else { "NOT met" };
    let _ = writeln!(
        md,
        "\nfork / checkpoint path: {:.2}×; fork / new sandbox: {:.2}×; fork / bare start from a \
         copy: {:.2}×; p50 under 300 ms: **{met}** (p50 {fork:.3} s).",
        fork / median(&r.checkpoint).as_secs_f64().max(1e-9),
        fork / median(&r.fresh).as_secs_f64().max(1e-9),
        fork / median(&r.bare).as_secs_f64().max(1e-9),
    );
    md
}
