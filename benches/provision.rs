//! Provisioning speed as ratios against a floor measured in the same run, so
//! the figures hold on a small, noisy machine.
//!
//! - **floor**: what any tool has to pay. A bollard create+start of the
//!   engine container with sandboxd's security profile (the same
//!   [`ContainerSpec`] the provisioner builds), the published port, then the
//!   engine's own readiness probe (an authenticated login) polled on
//!   sandboxd's schedule: "bare docker run plus readiness".
//! - **sandboxd**: [`Client::provision`] of a one-engine row, from the INSERT
//!   to the ready status seen by the client, with the controller running
//!   in-process (grace 0, production-sized pool).
//!
//! Floor and sandboxd runs alternate (and swap order every iteration) so
//! they share the machine's noise; figures are medians, the ratio is
//! sandboxd/floor. A second table splits sandboxd's time into phases, from
//! when the controller's tracing spans (`reconcile`, `provision`,
//! `wait_ready`) open and close, and a LISTEN on both channels.
//!
//! The realistic mix of agents' requests (Postgres plain, `pg_trgm`,
//! `vector`, `vector,postgis`; Redis plain and `search`) against warm
//! pools learned from demand has a module of its own, `support/mix.rs`:
//! request to ready, heals after kill, rm -f and stop, and a chaos run.
//!
//! Run it with `scripts/bench.sh` (Docker, the local images and a throwaway
//! state Postgres). `BENCH_ITERS` (default 7) and `BENCH_BATCH_ITERS`
//! (default 3) set the iteration counts (`BENCH_ITERS` also the passes
//! over the mix), `BENCH_BATCH` (default 20) the batch size,
//! `BENCH_HEAL_ITERS` (default 3) the sandboxes per entry of the mix whose
//! heals are timed, `BENCH_CHAOS_SECONDS` (default 600) the chaos run. The
//! tables go to stdout and to `target/bench/provision.md`. `BENCH_ONLY`
//! runs one part alone, its table to `target/bench/<part>.md`: `pause`,
//! `reset`, `fork` (a fork of ~100 MiB against the checkpoint path and a
//! new sandbox, see `support/fork.rs`), `gvisor` (cold starts and pool claims under gVisor's runsc,
//! where dockerd has it registered), `swarm` (claims, cold and template
//! starts and heals on one host next to a single-node Swarm, see
//! `support/swarm.rs`), `seed` (seeded requests next to unseeded ones,
//! cold and warm, see `support/seed.rs`), and the mix's `mix`, `mix-heals` and `chaos` (each
//! against a floor measured first), e.g.
//! `BENCH_ONLY=chaos BENCH_CHAOS_SECONDS=60 cargo bench --bench provision`.

#[path = "../tests/integration/common/mod.rs"]
mod common;
#[path = "support/fork.rs"]
mod fork;
#[path = "support/measure.rs"]
mod measure;
#[path = "support/mix.rs"]
mod mix;
#[path = "support/seed.rs"]
mod seed;
#[path = "support/swarm.rs"]
mod swarm;

use common::{sandbox_id, TestEnv};
use futures::future::join_all;
use sandboxd::adapters::postgres::{DESIRED_CHANNEL, STATUS_CHANNEL};
use sandboxd::adapters::PgStore;
use sandboxd::client::{Client, SandboxRequest};
use sandboxd::config::{ControllerConfig, NetworkLayout};
use sandboxd::controller::network::Placement;
use sandboxd::controller::provision;
use sandboxd::domain::isolation::{Isolation, RUNSC};
use sandboxd::domain::network::bridge_name;
use sandboxd::domain::{ContainerId, SandboxId, Secret};
use sandboxd::engine::{self, Engine};
use sandboxd::ports::runtime::NetworkSpec;
use sandboxd::ports::runtime::{Containers, Host};
use sandboxd::ports::Runtime;
use sqlx::postgres::PgListener;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Label on floor containers (value: this run's tag), for cleanup.
const FLOOR_LABEL: &str = "io.sandboxd.bench";
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const GONE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle time between runs, so one run's teardown does not bleed into the next.
const SETTLE: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------
// Timeline marks: the controller's spans opening and closing, and NOTIFYs
// seen by a listener.

/// What a mark records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edge {
    /// A span was entered for the first time.
    Open,
    /// A span closed.
    Close,
    /// A NOTIFY arrived.
    Notify,
}

struct Mark {
    at: Instant,
    /// Span name (`reconcile`, `provision`, `wait_ready`) or NOTIFY channel.
    name: String,
    edge: Edge,
    /// The sandbox: the `sandbox` field of the span or of its `reconcile`
    /// ancestor, or the NOTIFY payload.
    sandbox: String,
    /// `attempts` recorded on `wait_ready` (failed probes before the one
    /// that passed).
    attempts: Option<u64>,
}

static MARKS: Mutex<Vec<Mark>> = Mutex::new(Vec::new());

fn push_mark(name: &str, edge: Edge, sandbox: &str, attempts: Option<u64>) {
    let mark = Mark {
        at: Instant::now(),
        name: name.to_owned(),
        edge,
        sandbox: sandbox.to_owned(),
        attempts,
    };
    MARKS.lock().expect("marks lock").push(mark);
}

/// What the capture layer keeps per span.
#[derive(Default, Clone)]
struct SpanFields {
    sandbox: Option<String>,
    attempts: Option<u64>,
    entered: bool,
}

impl Visit for SpanFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "sandbox" {
            self.sandbox = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "sandbox" {
            self.sandbox = Some(value.to_owned());
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "attempts" {
            self.attempts = Some(value);
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record_u64(field, value.max(0) as u64);
    }
}

/// Records when each controller span of a sandbox first opens and closes.
struct Capture;

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = SpanFields::default();
        attrs.record(&mut fields);
        if fields.sandbox.is_none() {
            // Inherit the sandbox of the enclosing `reconcile`.
            fields.sandbox = span.scope().skip(1).find_map(|parent| {
                parent
                    .extensions()
                    .get::<SpanFields>()
                    .and_then(|f| f.sandbox.clone())
            });
        }
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<SpanFields>() {
                values.record(fields);
            }
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(fields) = ext.get_mut::<SpanFields>() else {
            return;
        };
        if !fields.entered {
            fields.entered = true;
            if let Some(sandbox) = &fields.sandbox {
                push_mark(span.name(), Edge::Open, sandbox, None);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        if let Some(SpanFields {
            sandbox: Some(sandbox),
            attempts,
            ..
        }) = ext.get::<SpanFields>()
        {
            push_mark(span.name(), Edge::Close, sandbox, *attempts);
        }
    }
}

fn init_tracing() {
    let capture = Targets::new().with_target("sandboxd::controller", LevelFilter::DEBUG);
    let stderr = Targets::new().with_target("sandboxd", LevelFilter::WARN);
    tracing_subscriber::registry()
        .with(Capture.with_filter(capture))
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(stderr),
        )
        .init();
}

/// Listens on both channels on its own connection and marks every NOTIFY.
async fn watch_notifies(url: String) {
    let mut listener = PgListener::connect(&url).await.expect("bench listener");
    listener
        .listen_all([DESIRED_CHANNEL, STATUS_CHANNEL])
        .await
        .expect("LISTEN");
    while let Ok(n) = listener.recv().await {
        push_mark(n.channel(), Edge::Notify, n.payload(), None);
    }
}

/// The first mark of `sandbox` at or after `from` with this name and edge:
/// when, and its `attempts`.
fn mark_after(
    from: Instant,
    name: &str,
    edge: Edge,
    sandbox: &str,
) -> Option<(Instant, Option<u64>)> {
    let marks = MARKS.lock().expect("marks lock");
    marks
        .iter()
        .find(|m| m.at >= from && m.name == name && m.edge == edge && m.sandbox == sandbox)
        .map(|m| (m.at, m.attempts))
}

/// When the last mark of `sandbox` before `until` with this name and edge was made.
fn mark_before(until: Instant, name: &str, edge: Edge, sandbox: &str) -> Option<Instant> {
    let marks = MARKS.lock().expect("marks lock");
    marks
        .iter()
        .filter(|m| m.at <= until && m.name == name && m.edge == edge && m.sandbox == sandbox)
        .map(|m| m.at)
        .next_back()
}

// ---------------------------------------------------------------------------
// Phases.

const SANDBOXD_PHASES: &[&str] = &[
    "INSERT → desired NOTIFY seen (write + commit + NOTIFY)",
    "→ reconcile starts (controller wake-up, queue)",
    "→ provision starts (2 reads + docker list, plan, \"provisioning\" status write)",
    "→ readiness loop starts (image inspect, create+start, port)",
    "→ probe OK (readiness polling)",
    "→ provision returned (feature enable + verify logins)",
    "→ ready NOTIFY seen (\"ready\" status write + NOTIFY)",
    "→ client returns (client wake-up + status read)",
];
const FLOOR_PHASES: &[&str] = &["floor: create+start, port", "floor: readiness polling"];

/// One sandboxd run split into [`SANDBOXD_PHASES`] (None where a mark is
/// missing), and the failed probes before the one that passed.
struct Phases {
    phases: Vec<Option<Duration>>,
    attempts: Option<u64>,
}

fn sandboxd_phases(t0: Instant, t_end: Instant, id: &SandboxId) -> Phases {
    let id = id.as_str();
    let at = |m: Option<(Instant, Option<u64>)>| m.map(|m| m.0);
    let probe_ok = mark_after(t0, "wait_ready", Edge::Close, id);
    let points = [
        Some(t0),
        at(mark_after(t0, DESIRED_CHANNEL, Edge::Notify, id)),
        at(mark_after(t0, "reconcile", Edge::Open, id)),
        at(mark_after(t0, "provision", Edge::Open, id)),
        at(mark_after(t0, "wait_ready", Edge::Open, id)),
        at(probe_ok),
        at(mark_after(t0, "provision", Edge::Close, id)),
        mark_before(t_end, STATUS_CHANNEL, Edge::Notify, id),
        Some(t_end),
    ];
    Phases {
        phases: points
            .windows(2)
            // Two watchers may see one NOTIFY in either order: a phase
            // that ends before it starts took no time.
            .map(|w| match (w[0], w[1]) {
                (Some(a), Some(b)) => Some(b.saturating_duration_since(a)),
                _ => None,
            })
            .collect(),
        attempts: probe_ok.and_then(|m| m.1),
    }
}

// ---------------------------------------------------------------------------
// The floor: bare create+start plus readiness.

struct FloorRun {
    container: ContainerId,
    total: Duration,
    /// create+start and the published port.
    create_start: Duration,
    /// The readiness loop.
    readiness: Duration,
    /// Failed probes before the one that passed.
    attempts: u32,
}

/// Creates and starts `engine`'s container the way the provisioner does
/// and polls its probe on the provisioner's schedule until it passes.
async fn floor_once(
    runtime: &dyn Runtime,
    config: &ControllerConfig,
    engine: &'static dyn Engine,
    name: String,
    tag: &str,
) -> FloorRun {
    let credentials = engine.credentials(Secret::generate());
    // What a bare `docker run` of an isolated sandbox needs: its own
    // network (from the same pool), then the container.
    let network_name = format!("{name}-net");
    let network = NetworkSpec {
        bridge: Some(bridge_name(&network_name)),
        name: network_name,
        labels: HashMap::from([(FLOOR_LABEL.to_owned(), tag.to_owned())]),
        subnets: match &config.network {
            NetworkLayout::PerSandbox { subnets, .. } => Some(*subnets),
            NetworkLayout::Shared { .. } => None,
        },
        egress: false,
    };
    let placement = Placement {
        container: name.clone(),
        network: network.name.clone(),
        host: engine.name().as_str().to_owned(),
        aliases: vec![engine.name().as_str().to_owned()],
    };
    let spec = provision::container_spec(
        config,
        engine,
        &placement,
        &config.images.image_for(engine, false),
        &credentials,
        &BTreeSet::new(),
        HashMap::from([(FLOOR_LABEL.to_owned(), tag.to_owned())]),
        None,
    );
    let t0 = Instant::now();
    runtime
        .ensure_network(&network)
        .await
        .expect("floor network");
    let id = runtime
        .create_and_start(&spec)
        .await
        .expect("floor create+start");
    let port = runtime
        .published_port(&id)
        .await
        .expect("floor inspect")
        .expect("floor published port");
    let create_start = t0.elapsed();
    // The provisioner's own readiness loop.
    let attempts =
        provision::wait_ready(runtime, engine, &id, &name, "127.0.0.1", port, &credentials)
            .await
            .unwrap_or_else(|e| panic!("floor {name} not ready: {e}"));
    let total = t0.elapsed();
    FloorRun {
        container: id,
        total,
        create_start,
        readiness: total - create_start,
        attempts,
    }
}

/// Removes the floor containers left by this run, even after a panic.
struct FloorCleanup(String);

impl Drop for FloorCleanup {
    fn drop(&mut self) {
        common::remove_containers_labelled(&format!("{FLOOR_LABEL}={}", self.0));
        remove_floor_networks(&self.0);
    }
}

/// Removes the floor networks of run `tag`.
fn remove_floor_networks(tag: &str) {
    let out = std::process::Command::new("docker")
        .args([
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("label={FLOOR_LABEL}={tag}"),
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let ids: Vec<&str> = out.split_whitespace().collect();
    if !ids.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["network", "rm"])
            .args(&ids)
            .output();
    }
}

// ---------------------------------------------------------------------------
// Controllers with other settings, heals, and an idle fleet.

/// Starts a controller with `config` and waits until it is ready.
async fn start_controller(env: &TestEnv, config: ControllerConfig) -> common::RunningController {
    let controller = env.start(config);
    common::eventually("controller ready", Duration::from_secs(60), || async {
        controller.readiness.is_ready().then_some(())
    })
    .await;
    controller
}

/// Waits until `n` Postgres template jobs have succeeded.
async fn templates_built(controller: &common::RunningController, n: f64) {
    common::eventually("templates built", READY_TIMEOUT, || async {
        let built = common::sample(
            &controller.metrics.render(),
            "sandboxd_template_builds_total{engine=\"postgres\",result=\"ok\"}",
        );
        (built.unwrap_or(0.0) >= n).then_some(())
    })
    .await;
}

/// `iters` times: a one-engine sandbox is provisioned, its container
/// killed (`docker kill`), and the time from the kill until the status
/// says ready again with one more heal is taken. Each sandbox is released.
/// With `pool`, each kill waits until that controller's warm pool has
/// refilled (the sandbox claimed its container).
async fn heals(
    bench: &Bench,
    engine: &str,
    iters: usize,
    pool: Option<&common::RunningController>,
) -> Vec<Duration> {
    heals_of(bench, engine, iters, pool, false).await
}

/// [`heals`]; `swarm`: the sandbox's engine is a Swarm service, whose task
/// container is killed.
async fn heals_of(
    bench: &Bench,
    engine: &str,
    iters: usize,
    pool: Option<&common::RunningController>,
    swarm: bool,
) -> Vec<Duration> {
    use bollard::query_parameters::KillContainerOptions;
    let mut times = Vec::new();
    for _ in 0..iters {
        let id = sandbox_id("bench-heal");
        let before = bench
            .client
            .provision(&id, &request(engine), READY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("sandbox {id}: {e}"));
        let heals = before.services[engine].heals;
        // By name: a container claimed from the warm pool has no sandbox
        // label, but it has the sandbox's container name.
        let engine_name = engine::lookup(engine).expect("engine").name();
        let victim = if swarm {
            swarm::task_of(bench, &id).await
        } else {
            sandboxd::domain::network::container_name(&bench.config.deployment, &id, engine_name)
        };
        if let Some(controller) = pool {
            pool_full(controller, engine).await;
        }
        tokio::time::sleep(SETTLE).await;
        let t0 = Instant::now();
        bench
            .env
            .docker
            .kill_container(&victim, None::<KillContainerOptions>)
            .await
            .expect("docker kill");
        loop {
            let s = bench.client.status(&id).await.expect("status");
            if let Some(s) = s {
                if s.phase == sandboxd::domain::Phase::Ready && s.services[engine].heals > heals {
                    break;
                }
            }
            assert!(t0.elapsed() < READY_TIMEOUT, "{id} was not healed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        times.push(t0.elapsed());
        bench.client.release(&id).await.expect("release");
        common::eventually("teardown", GONE_TIMEOUT, || async {
            bench
                .env
                .containers(Some(&id))
                .await
                .is_empty()
                .then_some(())
        })
        .await;
    }
    times
}

/// Reset-to-checkpoint times against their floor, Postgres.
struct Resets {
    /// Size of the checkpointed database.
    bytes: i64,
    /// The floor: one `docker exec` of psql that copies the checkpoint
    /// database (`CREATE DATABASE ... TEMPLATE ... STRATEGY FILE_COPY`) in
    /// the sandbox's own cluster, what any reset of this size pays.
    floor: Vec<Duration>,
    /// `Client::reset` to the checkpoint, from the call until it returned.
    reset: Vec<Duration>,
}

/// `iters` times, alternating: a floor copy of the checkpoint, then a
/// reset of a Postgres sandbox whose ~100 MB table was checkpointed and
/// then dropped for other data. One sandbox (its memory cap raised for a
/// 100 MB table, its checkpoint and a reset's copy), released at the end.
async fn resets(bench: &Bench, iters: usize) -> Resets {
    use sqlx::Connection;
    let id = sandbox_id("bench-reset");
    let status = bench
        .client
        .provision(&id, &request("postgres"), READY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("sandbox {id}: {e}"));
    let url = common::host_pg_url(&status.services["postgres"]);
    let container = sandboxd::domain::network::container_name(
        &bench.config.deployment,
        &id,
        engine::lookup("postgres").expect("postgres").name(),
    );
    let mut con = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query(
        "CREATE TABLE big AS SELECT g AS id, md5(g::text) || repeat('x', 60) AS v FROM generate_series(1, 750000) g",
    )
    .execute(&mut con)
    .await
    .expect("fill");
    con.close().await.expect("close");
    let checkpoint = bench
        .client
        .checkpoint(&id, "filled", READY_TIMEOUT)
        .await
        .expect("checkpoint");
    let copy = |sql: &str| {
        format!(
            "psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -U postgres -d template1 -c '{sql}'"
        )
    };
    let mut out = Resets {
        bytes: checkpoint.size_bytes.unwrap_or(0),
        floor: Vec::new(),
        reset: Vec::new(),
    };
    for i in 0..iters {
        let floor = async {
            let t0 = Instant::now();
            let (code, text) = common::exec_in(
                &bench.env,
                &container,
                &copy("CREATE DATABASE bench_floor TEMPLATE sandboxd_checkpoint_filled STRATEGY FILE_COPY"),
                Vec::new(),
            )
            .await;
            let took = t0.elapsed();
            assert_eq!(code, 0, "floor copy: {text}");
            let (code, text) = common::exec_in(
                &bench.env,
                &container,
                &copy("DROP DATABASE bench_floor"),
                Vec::new(),
            )
            .await;
            assert_eq!(code, 0, "floor drop: {text}");
            took
        };
        let reset = async {
            let mut con = sqlx::PgConnection::connect(&url).await.expect("connect");
            sqlx::raw_sql("DROP TABLE IF EXISTS big; CREATE TABLE other AS SELECT g FROM generate_series(1, 1000) g")
                .execute(&mut con)
                .await
                .expect("other data");
            con.close().await.expect("close");
            tokio::time::sleep(SETTLE).await;
            let t0 = Instant::now();
            bench
                .client
                .reset(&id, Some("filled"), READY_TIMEOUT)
                .await
                .expect("reset");
            t0.elapsed()
        };
        // Alternate which goes first, as the provisioning scenarios do.
        if i % 2 == 0 {
            out.floor.push(floor.await);
            out.reset.push(reset.await);
        } else {
            out.reset.push(reset.await);
            out.floor.push(floor.await);
        }
        tokio::time::sleep(SETTLE).await;
    }
    bench.client.release(&id).await.expect("release");
    common::eventually("teardown", GONE_TIMEOUT, || async {
        bench
            .env
            .containers(Some(&id))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    out
}

fn reset_report(r: &Resets) -> String {
    let mut md = String::new();
    let floor = median(&r.floor);
    let reset = median(&r.reset);
    let _ = writeln!(md, "\n## Reset to a checkpoint\n");
    let _ = writeln!(
        md,
        "A Postgres sandbox with a table of {:.0} MiB, checkpointed, then the table dropped for \
         other data; `Client::reset` to the checkpoint, from the call until it returned (the \
         request row, NOTIFY, the controller's reconcile, the reset in the container, the \
         client's poll). Floor: one `docker exec` of psql copying the checkpoint database \
         (`CREATE DATABASE ... TEMPLATE ... STRATEGY FILE_COPY`) in the same cluster. Target: \
         reset under 1 s.\n",
        r.bytes as f64 / (1024.0 * 1024.0)
    );
    let _ = writeln!(md, "| | p50 s | max s | n |");
    let _ = writeln!(md, "|---|---:|---:|---:|");
    for (name, times) in [
        ("floor: copy the checkpoint", &r.floor),
        ("sandboxd: reset", &r.reset),
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
    let ratio = reset.as_secs_f64() / floor.as_secs_f64().max(1e-9);
    let met = if reset < Duration::from_secs(1) {
        "met"
    } else {
        "NOT met"
    };
    let _ = writeln!(
        md,
        "\nsandboxd/floor: {ratio:.2}×; reset under 1 s: **{met}** (p50 {:.3} s).",
        reset.as_secs_f64()
    );
    md
}

/// The controller configuration of the reset case: a memory cap that holds
/// a 100 MB table, its checkpoint and a reset's copy.
fn reset_config(base: &ControllerConfig) -> ControllerConfig {
    let mut c = base.clone();
    c.limits.memory_bytes = 768 * 1024 * 1024;
    c.limits.tmpfs_bytes = 768 * 1024 * 1024;
    c
}

/// What a fleet of idle sandboxes costs.
struct Idle {
    /// Sandboxes per engine.
    sandboxes: Vec<(String, usize)>,
    /// From the inserts until all were ready.
    provision_wall: Duration,
    /// How long they idled.
    idled: Duration,
    /// This process's CPU seconds while they idled (the controller runs
    /// in it; the bench only sleeps meanwhile).
    cpu_seconds: f64,
    /// Docker API calls per minute while they idled.
    docker_calls_per_minute: f64,
    /// This process's resident memory after the idle time, and its peak.
    rss: u64,
    peak_rss: u64,
    /// Memory of each engine's containers after the idle time.
    memory: BTreeMap<String, Vec<u64>>,
}

/// Provisions `per_engine` sandboxes at once, lets them idle for `hold`,
/// measures, and releases them.
async fn idle_fleet(
    bench: &Bench,
    controller: &common::RunningController,
    per_engine: &[(&str, usize)],
    hold: Duration,
) -> Idle {
    let mut ids: Vec<(SandboxId, &str)> = Vec::new();
    for (engine, n) in per_engine {
        ids.extend((0..*n).map(|_| (sandbox_id("bench-idle"), *engine)));
    }
    let t0 = Instant::now();
    for (id, engine) in &ids {
        bench
            .client
            .apply(id, &request(engine))
            .await
            .expect("apply");
    }
    common::eventually(
        "the idle fleet to be ready",
        Duration::from_secs(900),
        || async {
            for (id, _) in &ids {
                let s = bench.client.status(id).await.ok()??;
                if s.phase != sandboxd::domain::Phase::Ready {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let provision_wall = t0.elapsed();
    eprintln!(
        "bench: {} idle sandboxes ready in {:.1}s; idling {}s",
        ids.len(),
        provision_wall.as_secs_f64(),
        hold.as_secs()
    );
    // Let the provisioning's tail (status writes, relists) settle first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls0 = measure::docker_calls(&controller.metrics.render());
    let cpu0 = measure::process_cpu_seconds();
    let t_idle = Instant::now();
    tokio::time::sleep(hold).await;
    let idled = t_idle.elapsed();
    let cpu_seconds = measure::process_cpu_seconds() - cpu0;
    let calls = measure::docker_calls(&controller.metrics.render()) - calls0;
    let mut memory: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for c in bench.env.containers(None).await {
        if let Some(m) = measure::container_memory(&bench.env.docker, c.id.as_str()).await {
            memory.entry(c.labels.engine.clone()).or_default().push(m);
        }
    }
    let out = Idle {
        sandboxes: per_engine
            .iter()
            .map(|(e, n)| ((*e).to_owned(), *n))
            .collect(),
        provision_wall,
        idled,
        cpu_seconds,
        docker_calls_per_minute: calls / idled.as_secs_f64() * 60.0,
        rss: measure::rss_bytes(),
        peak_rss: measure::peak_rss_bytes(),
        memory,
    };
    for (id, _) in &ids {
        bench.client.release(id).await.expect("release");
    }
    common::eventually("the idle fleet to go", Duration::from_secs(900), || async {
        bench.env.containers(None).await.is_empty().then_some(())
    })
    .await;
    out
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn median_u64(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The bench.

struct Bench {
    env: TestEnv,
    config: ControllerConfig,
    client: Client,
    tag: String,
    seq: usize,
    /// A smoke run (`cargo test`, not `cargo bench`): one short pass.
    smoke: bool,
}

fn request(engine: &str) -> SandboxRequest {
    SandboxRequest {
        owner: "bench".into(),
        services: vec![engine.to_owned()],
        features: BTreeMap::new(),
        attach: Vec::new(),
        expires_at: None,
        ..Default::default()
    }
}

impl Bench {
    fn floor_name(&mut self, engine: &str) -> String {
        self.seq += 1;
        format!("sandboxd-bench-{}-{}-{engine}", self.tag, self.seq)
    }

    async fn remove_floor(&self, runs: &[FloorRun]) {
        join_all(
            runs.iter()
                .map(|r| self.env.runtime.remove(&r.container, Duration::ZERO)),
        )
        .await
        .into_iter()
        .for_each(|r| r.expect("remove floor container"));
        remove_floor_networks(&self.tag);
    }

    /// Starts `n` floor containers at once; returns the wall time until all
    /// were ready, and each run. Removes them.
    async fn floor(&mut self, engine: &'static dyn Engine, n: usize) -> (Duration, Vec<FloorRun>) {
        let names: Vec<String> = (0..n)
            .map(|_| self.floor_name(engine.name().as_str()))
            .collect();
        let t0 = Instant::now();
        let runtime = self.env.runtime.as_ref();
        let runs = join_all(
            names
                .into_iter()
                .map(|name| floor_once(runtime, &self.config, engine, name, &self.tag)),
        )
        .await;
        let wall = t0.elapsed();
        self.remove_floor(&runs).await;
        (wall, runs)
    }

    /// Provisions `n` one-engine sandboxes at once; returns the wall time and,
    /// for each, its id and when the client saw it ready. Releases them and
    /// waits until their containers and status rows are gone.
    async fn sandboxd(
        &self,
        engine: &str,
        n: usize,
    ) -> (Instant, Duration, Vec<(SandboxId, Instant)>) {
        let ids: Vec<SandboxId> = (0..n).map(|_| sandbox_id("bench")).collect();
        let req = request(engine);
        let t0 = Instant::now();
        let req = &req;
        let done = join_all(ids.iter().map(|id| async move {
            let status = self
                .client
                .provision(id, req, READY_TIMEOUT)
                .await
                .unwrap_or_else(|e| panic!("sandbox {id}: {e}"));
            assert_eq!(status.phase, sandboxd::domain::Phase::Ready);
            (id.clone(), Instant::now())
        }))
        .await;
        let wall = t0.elapsed();
        for id in &ids {
            self.client.release(id).await.expect("release");
        }
        for id in &ids {
            common::eventually("teardown", GONE_TIMEOUT, || async {
                let status = self.client.status(id).await.expect("status");
                let containers = self.env.containers(Some(id)).await;
                (status.is_none() && containers.is_empty()).then_some(())
            })
            .await;
        }
        (t0, wall, done)
    }
}

fn median(values: &[Duration]) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

fn median_of(values: &[Option<Duration>]) -> Option<Duration> {
    let v: Vec<Duration> = values.iter().flatten().copied().collect();
    (v.len() == values.len() && !v.is_empty()).then(|| median(&v))
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

struct Row {
    scenario: String,
    floor: Vec<Duration>,
    sandboxd: Vec<Duration>,
}

/// One scenario's measurements: wall times per iteration (the table), and
/// per sandbox or floor container the phases (the breakdown).
struct Scenario {
    row: Row,
    /// Column title in the breakdown.
    column: String,
    phases: Vec<Phases>,
    /// Per sandbox: INSERT to ready seen by its client.
    totals: Vec<Duration>,
    floor_phases: Vec<[Duration; 2]>,
    floor_totals: Vec<Duration>,
    floor_attempts: Vec<u32>,
}

/// `iters` iterations of `n` floor containers at once and `n` sandboxes at
/// once, alternating which goes first.
async fn scenario(
    bench: &mut Bench,
    engine: &'static dyn Engine,
    n: usize,
    iters: usize,
) -> Scenario {
    let (scenario, column) = if n == 1 {
        let s = format!("{}, 1 sandbox (n={iters})", engine.name().as_str());
        (s.clone(), s)
    } else {
        (
            format!("{} × {n} at once, wall time (n={iters})", engine.name()),
            format!("{} × {n}, per sandbox", engine.name()),
        )
    };
    let mut out = Scenario {
        row: Row {
            scenario,
            floor: Vec::new(),
            sandboxd: Vec::new(),
        },
        column,
        phases: Vec::new(),
        totals: Vec::new(),
        floor_phases: Vec::new(),
        floor_totals: Vec::new(),
        floor_attempts: Vec::new(),
    };
    for i in 0..iters {
        for floor_turn in [i % 2 == 0, i % 2 == 1] {
            if floor_turn {
                let (wall, runs) = bench.floor(engine, n).await;
                out.row.floor.push(wall);
                for run in runs {
                    out.floor_phases.push([run.create_start, run.readiness]);
                    out.floor_totals.push(run.total);
                    out.floor_attempts.push(run.attempts);
                }
            } else {
                let (t0, wall, done) = bench.sandboxd(engine.name().as_str(), n).await;
                out.row.sandboxd.push(wall);
                for (id, t_end) in &done {
                    out.phases.push(sandboxd_phases(t0, *t_end, id));
                    out.totals.push(*t_end - t0);
                }
            }
            tokio::time::sleep(SETTLE).await;
        }
        eprintln!(
            "bench: {} #{}: floor {:.3}s, sandboxd {:.3}s",
            out.row.scenario,
            i + 1,
            out.row.floor[i].as_secs_f64(),
            out.row.sandboxd[i].as_secs_f64()
        );
    }
    out
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "n/a".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3))
}

/// Ratios of each iteration's adjacent sandboxd and floor runs.
fn paired_ratios(row: &Row) -> Vec<f64> {
    let mut r: Vec<f64> = row
        .floor
        .iter()
        .zip(&row.sandboxd)
        .map(|(f, s)| s.as_secs_f64() / f.as_secs_f64())
        .collect();
    r.sort_by(f64::total_cmp);
    r
}

fn report(scenarios: &[&Scenario], batch_size: usize, concurrency: usize) -> String {
    let rows: Vec<&Row> = scenarios.iter().map(|s| &s.row).collect();
    let singles = scenarios;
    let mut md = String::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(md, "## sandboxd provisioning vs floor ({cores} cores)\n");
    let _ = writeln!(
        md,
        "floor = bollard create+start with sandboxd's security profile + the engine's \
         authenticated readiness probe on sandboxd's polling schedule; sandboxd = \
         `Client::provision` from INSERT to ready status seen by the client (controller \
         in-process, grace 0). Runs interleaved; medians.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | floor median s | sandboxd median s | ratio |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|");
    for row in &rows {
        let f = median(&row.floor).as_secs_f64();
        let s = median(&row.sandboxd).as_secs_f64();
        let _ = writeln!(md, "| {} | {f:.3} | {s:.3} | {:.2} |", row.scenario, s / f);
    }
    let _ = writeln!(
        md,
        "\nPer-iteration ratios (each sandboxd run over the floor run next to it), sorted:\n"
    );
    for row in &rows {
        let r: Vec<String> = paired_ratios(row)
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect();
        let _ = writeln!(md, "- {}: {}", row.scenario, r.join(", "));
    }
    let _ = writeln!(
        md,
        "\nWhere the time goes (per sandbox or floor container, median ms per phase; \
         medians do not add up exactly to the total; in a batch every sandbox's clock \
         starts when the batch is inserted):\n"
    );
    let mut header = "| phase |".to_owned();
    let mut rule = "|---|".to_owned();
    for s in singles {
        let _ = write!(header, " {} |", s.column);
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{header}\n{rule}");
    for (p, name) in SANDBOXD_PHASES.iter().enumerate() {
        let mut line = format!("| {name} |");
        for s in singles {
            let v: Vec<Option<Duration>> = s.phases.iter().map(|r| r.phases[p]).collect();
            let _ = write!(line, " {} |", ms(median_of(&v)));
        }
        let _ = writeln!(md, "{line}");
    }
    let mut line = "| **sandboxd total** (INSERT → ready seen) |".to_owned();
    for s in singles {
        let _ = write!(line, " {} |", ms(Some(median(&s.totals))));
    }
    let _ = writeln!(md, "{line}");
    for (p, name) in FLOOR_PHASES.iter().enumerate() {
        let mut line = format!("| {name} |");
        for s in singles {
            let v: Vec<Duration> = s.floor_phases.iter().map(|r| r[p]).collect();
            let _ = write!(line, " {} |", ms(Some(median(&v))));
        }
        let _ = writeln!(md, "{line}");
    }
    let mut line = "| **floor total** |".to_owned();
    for s in singles {
        let _ = write!(line, " {} |", ms(Some(median(&s.floor_totals))));
    }
    let _ = writeln!(md, "{line}");
    let mut line = "| failed probes before ready, median (sandboxd / floor) |".to_owned();
    for s in singles {
        let mut a: Vec<u64> = s.phases.iter().filter_map(|p| p.attempts).collect();
        let mut b: Vec<u32> = s.floor_attempts.clone();
        a.sort_unstable();
        b.sort_unstable();
        let mid = |n: usize| n / 2;
        let _ = write!(
            line,
            " {} / {} |",
            a.get(mid(a.len())).map_or("n/a".into(), |x| x.to_string()),
            b.get(mid(b.len())).map_or("n/a".into(), |x| x.to_string())
        );
    }
    let _ = writeln!(md, "{line}");
    let _ = writeln!(
        md,
        "\nBatch = {batch_size} one-engine rows inserted at once (controller concurrency \
         {concurrency}), versus {batch_size} floor containers started at once."
    );
    md
}

/// Waits until the warm pool of `engine` holds a ready container.
async fn pool_full(controller: &common::RunningController, engine: &str) {
    common::eventually("the warm pool to refill", READY_TIMEOUT, || async {
        let ready = common::sample(
            &controller.metrics.render(),
            &format!("sandboxd_pool_size{{engine=\"{engine}\",state=\"ready\"}}"),
        );
        (ready.unwrap_or(0.0) >= 1.0).then_some(())
    })
    .await;
}

/// `iters` sandboxes served by the warm pool, one at a time (the pool
/// refilled before each): request-to-ready seen by the client.
async fn pool_hits(
    bench: &Bench,
    controller: &common::RunningController,
    engine: &str,
    iters: usize,
) -> Vec<Duration> {
    let mut times = Vec::new();
    for _ in 0..iters {
        pool_full(controller, engine).await;
        tokio::time::sleep(SETTLE).await;
        let (t0, _, done) = bench.sandboxd(engine, 1).await;
        times.extend(done.iter().map(|(_, end)| *end - t0));
    }
    times
}

fn pool_report(rows: &[(&str, &Scenario, &[Duration])]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## Warm pool\n");
    let _ = writeln!(
        md,
        "One ready container per engine in reserve (templates on); each sandbox is \
         requested once the pool has refilled. Request-to-ready seen by the client, \
         against the cold sandboxes of this run.\n"
    );
    let _ = writeln!(
        md,
        "| engine | pool hit p50 ms | max ms | cold p50 ms | faster | n |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for (engine, cold, hits) in rows {
        let hit = median(hits).as_secs_f64();
        let max = hits.iter().max().copied().unwrap_or_default().as_secs_f64();
        let cold = median(&cold.totals).as_secs_f64();
        let _ = writeln!(
            md,
            "| {engine} | {:.0} | {:.0} | {:.0} | {:.1} × | {} |",
            hit * 1e3,
            max * 1e3,
            cold * 1e3,
            cold / hit,
            hits.len()
        );
    }
    md
}

/// One engine under gVisor: its cold starts (against a floor started bare
/// under runsc too) and its warm-pool claims.
struct GvisorRow {
    engine: String,
    cold: Scenario,
    hits: Vec<Duration>,
}

/// Cold starts of `engines` under gVisor (`--runtime runsc`: the floor's
/// containers run under it too), then `iters` claims each from a warm pool
/// of one container per engine (its containers under runsc as well).
/// `None` (said on standard error) where dockerd has no runtime runsc.
async fn gvisor_rows(
    bench: &mut Bench,
    engines: &[&'static dyn Engine],
    iters: usize,
) -> Option<Vec<GvisorRow>> {
    let runtimes = bench
        .env
        .runtime
        .oci_runtimes()
        .await
        .expect("docker info")
        .unwrap_or_default();
    if !runtimes.iter().any(|r| r == RUNSC) {
        eprintln!(
            "bench: dockerd has no runtime {RUNSC} (scripts/lib.sh: ensure_runsc install): no gVisor rows"
        );
        return None;
    }
    let runc = bench.config.clone();
    bench.config.isolation = Isolation::Gvisor;
    let controller = start_controller(&bench.env, bench.config.clone()).await;
    let mut cold = Vec::new();
    for engine in engines {
        bench.sandboxd(engine.name().as_str(), 1).await;
        let mut s = scenario(bench, *engine, 1, iters).await;
        s.row.scenario = format!("{} under gVisor, 1 sandbox (n={iters})", engine.name());
        s.column = format!("{}, gVisor", engine.name());
        cold.push(s);
    }
    controller.stop().await;

    let mut pooled = bench.config.clone();
    pooled.templates = true;
    pooled.warm_pool = sandboxd::config::warm_pools(
        &engines
            .iter()
            .map(|e| format!("{}=1", e.name()))
            .collect::<Vec<_>>(),
    )
    .expect("pool configuration");
    let controller = start_controller(&bench.env, pooled).await;
    let mut rows = Vec::new();
    for (engine, cold) in engines.iter().zip(cold) {
        let engine = engine.name().as_str().to_owned();
        let hits = pool_hits(bench, &controller, &engine, iters).await;
        rows.push(GvisorRow { engine, cold, hits });
    }
    controller.stop().await;
    bench.config = runc;
    Some(rows)
}

/// The gVisor table; `runc` holds this run's cold scenarios under runc (in
/// the order of `rows`), if measured.
fn gvisor_report(rows: &[GvisorRow], runc: &[&Scenario]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## gVisor (`--runtime runsc`)\n");
    let _ = writeln!(
        md,
        "Engines under gVisor's runsc (registered with runtimeArgs [\"--network=host\"]), \
         hardened as under runc. Cold: request-to-ready of one sandbox (templates off), \
         against the floor started bare under runsc. Pool: one ready container per engine \
         under runsc (templates on), each sandbox requested once the pool has refilled.\n"
    );
    let _ = writeln!(
        md,
        "| engine | floor p50 ms (runsc) | cold p50 ms | ratio | cold under runc p50 ms | pool hit p50 ms | n |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    for (i, row) in rows.iter().enumerate() {
        let floor = median(&row.cold.floor_totals).as_secs_f64();
        let cold = median(&row.cold.totals).as_secs_f64();
        let runc = runc.get(i).map_or("n/a".to_owned(), |s| {
            format!("{:.0}", median(&s.totals).as_secs_f64() * 1e3)
        });
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | {:.2} | {runc} | {:.0} | {} |",
            row.engine,
            floor * 1e3,
            cold * 1e3,
            cold / floor,
            median(&row.hits).as_secs_f64() * 1e3,
            row.cold.totals.len()
        );
    }
    md
}

/// Touch-to-ready of paused sandboxes, one engine per row.
struct Resumes {
    engine: String,
    /// A bare `docker unpause` of a paused container of the engine (the
    /// floor), each iteration.
    floor: Vec<Duration>,
    /// From `sandbox_touch` until the client reads `ready`, each iteration.
    sandboxd: Vec<Duration>,
}

/// Pauses a one-engine sandbox (idle after 1 s, `idle_action = pause`)
/// `iters` times and times each resume from a touch until the client sees
/// `ready` (the status polled every millisecond), against the floor: a
/// bare `docker unpause` through the API of a paused container created as
/// the provisioner creates one. Floor and sandboxd alternate, swapping
/// order every iteration.
async fn resumes(bench: &mut Bench, engine: &'static dyn Engine, iters: usize) -> Resumes {
    use sandboxd::domain::sandbox::IdleAction;
    use sandboxd::domain::Phase;
    let name = bench.floor_name(engine.name().as_str());
    let runtime = bench.env.runtime.clone();
    let floor = floor_once(runtime.as_ref(), &bench.config, engine, name, &bench.tag).await;
    let mut req = request(engine.name().as_str());
    req.idle_timeout = Some(Duration::from_secs(1));
    req.idle_action = IdleAction::Pause;
    let id = sandbox_id("bench-pause");
    let client = &bench.client;
    // Ready, or paused already: idle for a second, it may be paused before
    // a client waiting for `ready` reads the status (CI once saw that).
    client
        .apply(&id, &req)
        .await
        .unwrap_or_else(|e| panic!("sandbox {id}: {e}"));
    tokio::time::timeout(READY_TIMEOUT, async {
        loop {
            let s = client.status(&id).await.expect("status");
            match s.map(|s| (s.phase, s.message)) {
                Some((Phase::Ready | Phase::Paused, _)) => return,
                Some((Phase::Failed, message)) => panic!("sandbox {id} failed: {message}"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!("sandbox {id} was neither ready nor paused within {READY_TIMEOUT:?}")
    });
    let phase = |want: Phase| {
        let id = id.clone();
        async move {
            loop {
                let s = client.status(&id).await.expect("status");
                if s.is_some_and(|s| s.phase == want) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    let mut out = Resumes {
        engine: engine.name().as_str().to_owned(),
        floor: Vec::new(),
        sandboxd: Vec::new(),
    };
    for i in 0..iters {
        tokio::time::timeout(Duration::from_secs(60), phase(Phase::Paused))
            .await
            .unwrap_or_else(|_| panic!("{id} was not paused"));
        runtime.pause(&floor.container).await.expect("floor pause");
        tokio::time::sleep(SETTLE).await;
        let floor_run = async {
            let t0 = Instant::now();
            runtime
                .unpause(&floor.container)
                .await
                .expect("floor unpause");
            t0.elapsed()
        };
        let sandboxd_run = async {
            let t0 = Instant::now();
            assert!(client.touch(&id).await.expect("touch"), "{id} touched");
            tokio::time::timeout(Duration::from_secs(30), phase(Phase::Ready))
                .await
                .unwrap_or_else(|_| panic!("{id} was not resumed"));
            t0.elapsed()
        };
        let (f, s) = if i % 2 == 0 {
            let f = floor_run.await;
            (f, sandboxd_run.await)
        } else {
            let s = sandboxd_run.await;
            (floor_run.await, s)
        };
        out.floor.push(f);
        out.sandboxd.push(s);
    }
    client.release(&id).await.expect("release");
    bench.remove_floor(&[floor]).await;
    out
}

fn resume_report(rows: &[Resumes]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "\n## Resume a paused sandbox\n");
    let _ = writeln!(
        md,
        "From `sandbox_touch` until the client reads `ready` (same containers, data and \
         credentials), against the floor: a bare `docker unpause` through the API of a paused \
         container of the engine. Target: under 100 ms.\n"
    );
    let _ = writeln!(
        md,
        "| engine | floor p50 ms | sandboxd p50 ms | sandboxd max ms | ratio | n | under 100 ms |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|:---:|");
    for r in rows {
        let floor = median(&r.floor).as_secs_f64() * 1e3;
        let s = median(&r.sandboxd).as_secs_f64() * 1e3;
        let max = r.sandboxd.iter().max().copied().unwrap_or_default();
        let met = if s < 100.0 { "yes" } else { "**no**" };
        let _ = writeln!(
            md,
            "| {} | {floor:.1} | {s:.1} | {:.1} | {:.1} | {} | {met} |",
            r.engine,
            max.as_secs_f64() * 1e3,
            s / floor.max(f64::MIN_POSITIVE),
            r.sandboxd.len()
        );
    }
    md
}

fn heal_report(cold: &Scenario, rows: &[(&str, &[Duration])]) -> String {
    let mut md = String::new();
    let floor = median(&cold.floor_totals).as_secs_f64();
    let _ = writeln!(md, "\n## Heal after `docker kill`\n");
    let _ = writeln!(
        md,
        "From the kill until the status says ready again with one more heal (same \
         credentials), Postgres; with the warm pool, each kill waits until the pool has refilled \
         after the sandbox's own claim. The cold floor (create+start+ready) of this run is {floor:.3} s.\n"
    );
    let _ = writeln!(md, "| heal | p50 s | max s | n |");
    let _ = writeln!(md, "|---|---:|---:|---:|");
    for (name, times) in rows {
        let max = times.iter().max().copied().unwrap_or_default();
        let _ = writeln!(
            md,
            "| {name} | {:.3} | {:.3} | {} |",
            median(times).as_secs_f64(),
            max.as_secs_f64(),
            times.len()
        );
    }
    md
}

/// The admission budget of the idle fleet (`--memory-budget`). The budget
/// counts every engine at its memory cap (Postgres 256 MiB), and a hundred
/// Postgres caps exceed this host's memory, although idle they use a
/// seventh of it: the default budget would admit 86 and hold the rest.
const IDLE_BUDGET: u64 = 64 << 30;

fn idle_report(idle: &Idle) -> String {
    let mut md = String::new();
    let total: usize = idle.sandboxes.iter().map(|(_, n)| n).sum();
    let fleet: Vec<String> = idle
        .sandboxes
        .iter()
        .map(|(e, n)| format!("{n} {e}"))
        .collect();
    let _ = writeln!(md, "\n## {total} idle sandboxes\n");
    let _ = writeln!(
        md,
        "{} sandboxes (templates on, production relist interval, `--memory-budget {}GiB`: \
         the budget counts each engine at its memory cap, and a hundred Postgres caps \
         exceed this host's memory), ready {:.1} s after their inserts, then idle for \
         {:.0} s. The controller runs in the benchmark's \
         process, which only sleeps meanwhile: its CPU time and memory are the \
         controller's (an upper bound).\n",
        fleet.join(" + "),
        IDLE_BUDGET >> 30,
        idle.provision_wall.as_secs_f64(),
        idle.idled.as_secs_f64()
    );
    let _ = writeln!(md, "| measure | value |");
    let _ = writeln!(md, "|---|---:|");
    let _ = writeln!(
        md,
        "| controller CPU, seconds per minute idle | {:.3} ({:.2} % of one core) |",
        idle.cpu_seconds / idle.idled.as_secs_f64() * 60.0,
        idle.cpu_seconds / idle.idled.as_secs_f64() * 100.0
    );
    let _ = writeln!(
        md,
        "| Docker API calls per minute idle | {:.1} |",
        idle.docker_calls_per_minute
    );
    let _ = writeln!(
        md,
        "| controller resident memory (peak) | {:.1} MiB ({:.1} MiB) |",
        mib(idle.rss),
        mib(idle.peak_rss)
    );
    for (engine, values) in &idle.memory {
        let max = values.iter().max().copied().unwrap_or(0);
        let _ = writeln!(
            md,
            "| idle {engine} container memory, median (max) | {:.1} MiB ({:.1} MiB) |",
            mib(median_u64(values)),
            mib(max)
        );
    }
    let _ = writeln!(
        md,
        "\nContainer memory is what `docker stats` shows: the cgroup's usage without \
         its inactive file cache; tmpfs data counts."
    );
    md
}

/// What the targets are judged on.
struct Figures<'a> {
    cold_pg: &'a Scenario,
    template: &'a Scenario,
    burst: &'a Scenario,
    heal_cold: &'a [Duration],
    heal_template: &'a [Duration],
    heal_pool: &'a [Duration],
    pool: &'a [(&'a str, &'a Scenario, &'a [Duration])],
    idle: &'a Idle,
    /// The mix's targets (request to ready, heals, chaos).
    mix: Vec<mix::Target>,
}

fn targets(f: &Figures<'_>) -> String {
    let mut md = String::new();
    let cold_floor = median(&f.cold_pg.floor_totals).as_secs_f64();
    let template = median(&f.template.totals).as_secs_f64();
    let mut lines = Vec::new();
    lines.push((
        "template: Postgres request-to-ready under 0.6 s".to_owned(),
        format!("{template:.3} s"),
        template < 0.6,
    ));
    lines.push((
        "template: at most 0.45 of the cold floor".to_owned(),
        format!("{:.2} of {cold_floor:.3} s", template / cold_floor),
        template / cold_floor <= 0.45,
    ));
    let burst =
        median(&f.burst.row.sandboxd).as_secs_f64() / median(&f.burst.row.floor).as_secs_f64();
    lines.push((
        "burst of cold sandboxes: within 1.1 × the same containers started in parallel".to_owned(),
        format!("{burst:.2}"),
        burst <= 1.1,
    ));
    // Without a pool, `sandboxd run` heals from the template (its
    // default); the cold heal (templates off) is judged too.
    for (how, heals) in [
        ("from the template (the default)", f.heal_template),
        ("cold (templates off)", f.heal_cold),
    ] {
        let heal = median(heals).as_secs_f64();
        lines.push((
            format!("heal without a pool, {how}: within the cold floor + 200 ms"),
            format!("{heal:.3} s vs {:.3} s", cold_floor + 0.2),
            heal <= cold_floor + 0.2,
        ));
    }
    for (engine, cold, hits) in f.pool {
        let hit = median(hits).as_secs_f64();
        let cold = median(&cold.totals).as_secs_f64();
        lines.push((
            format!("warm pool hit, {engine}: p50 under 100 ms"),
            format!("{:.0} ms", hit * 1e3),
            hit < 0.1,
        ));
        lines.push((
            format!("warm pool hit, {engine}: at least 15 × faster than cold"),
            format!("{:.1} ×", cold / hit),
            cold / hit >= 15.0,
        ));
    }
    let heal = median(f.heal_pool).as_secs_f64();
    lines.push((
        "heal with a pool: p50 under 0.5 s".to_owned(),
        format!("{heal:.3} s"),
        heal < 0.5,
    ));
    let idle = f.idle;
    let cpu = idle.cpu_seconds / idle.idled.as_secs_f64() * 100.0;
    lines.push((
        "idle fleet: controller under 1 % of one core".to_owned(),
        format!("{cpu:.2} %"),
        cpu < 1.0,
    ));
    lines.push((
        "idle fleet: controller under 100 MB resident".to_owned(),
        format!("{:.1} MB", idle.rss as f64 / 1e6),
        (idle.rss as f64) < 100e6,
    ));
    for (engine, cap) in [("postgres", 40.0), ("redis", 10.0)] {
        let m = idle.memory.get(engine).map_or(0.0, |v| mib(median_u64(v)));
        lines.push((
            format!("idle {engine} sandbox under {cap:.0} MiB"),
            format!("{m:.1} MiB"),
            m > 0.0 && m < cap,
        ));
    }
    lines.extend(f.mix.iter().cloned());
    let _ = writeln!(md, "\n## Targets\n");
    let _ = writeln!(md, "| target | measured | met |");
    let _ = writeln!(md, "|---|---:|:---:|");
    for (target, measured, met) in lines {
        let met = if met { "yes" } else { "**no**" };
        let _ = writeln!(md, "| {target} | {measured} | {met} |");
    }
    md
}

/// Prints one part's table, and (unless `smoke`) writes it to
/// `target/bench/<name>.md`.
fn report_part(name: &str, md: &str, smoke: bool) {
    println!("{md}");
    if !smoke {
        let path = output_path().with_file_name(format!("{name}.md"));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create output dir");
        std::fs::write(&path, md).expect("write report");
        eprintln!("bench: wrote {}", path.display());
    }
}

fn output_path() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { manifest.join(t) })
        .unwrap_or_else(|| manifest.join("target"));
    target.join("bench").join("provision.md")
}

async fn run() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this
    // binary without it: then one short pass proves the bench still works,
    // and its figures are neither meaningful nor written.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let (iters, batch_iters, batch_size) = if smoke {
        eprintln!("bench: smoke run (not `cargo bench`): one short pass, no report");
        (1, 1, 2)
    } else {
        (
            env_usize("BENCH_ITERS", 7),
            env_usize("BENCH_BATCH_ITERS", 3),
            env_usize("BENCH_BATCH", 20),
        )
    };
    let (idle_each, idle_hold) = if smoke {
        (1, Duration::from_secs(1))
    } else {
        (
            env_usize("BENCH_IDLE", 200) / 2,
            Duration::from_secs(env_usize("BENCH_IDLE_SECONDS", 120) as u64),
        )
    };
    // The mix (benches/support/mix.rs): heal rounds per entry, and how
    // long the chaos run lasts.
    let (heal_iters, chaos_for) = if smoke {
        (1, Duration::from_secs(5))
    } else {
        (
            env_usize("BENCH_HEAL_ITERS", 3),
            Duration::from_secs(env_usize("BENCH_CHAOS_SECONDS", 600) as u64),
        )
    };
    let started = Instant::now();

    let mut env = TestEnv::new().await;
    // The production pool size (`sandboxd run`: concurrency × 2, 4..=32).
    let config = env.config();
    let pool_size = (config.concurrency as u32 * 2).clamp(4, 32);
    env.pool = PgStore::connect(&env.url, pool_size, sandboxd::engine::REGISTRY)
        .await
        .expect("controller pool")
        .pool()
        .clone();

    // An orchestrator's own pool: every waiting client holds a LISTEN
    // connection and needs another for its reads.
    let client_pool = PgStore::connect(
        &env.url,
        (batch_size as u32) * 2 + 2,
        sandboxd::engine::REGISTRY,
    )
    .await
    .expect("client pool")
    .pool()
    .clone();
    tokio::spawn(watch_notifies(env.url.clone()));
    let controller = env.start(config.clone());
    common::eventually("controller ready", Duration::from_secs(30), || async {
        controller.readiness.is_ready().then_some(())
    })
    .await;

    let tag = env.deployment.as_str().to_owned();
    let _floor_cleanup = FloorCleanup(tag.clone());
    let mut bench = Bench {
        env,
        config,
        client: Client::from_pool(client_pool),
        tag,
        seq: 0,
        smoke,
    };
    let postgres = engine::lookup("postgres").expect("postgres engine");
    let redis = engine::lookup("redis").expect("redis engine");

    // `BENCH_ONLY=pause`: only the resume of paused sandboxes.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("pause") {
        let rows = [
            resumes(&mut bench, postgres, iters).await,
            resumes(&mut bench, redis, iters).await,
        ];
        let md = resume_report(&rows);
        report_part("pause", &md, smoke);
        controller.stop().await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("gvisor") {
        // Cold starts and claims under gVisor alone: `BENCH_ONLY=gvisor
        // cargo bench --bench provision`; its table goes to target/bench/gvisor.md.
        controller.stop().await;
        let md = match gvisor_rows(&mut bench, &[postgres, redis], iters).await {
            Some(rows) => gvisor_report(&rows, &[]),
            None => String::new(),
        };
        report_part("gvisor", &md, smoke || md.is_empty());
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("reset") {
        // The reset case alone (about a minute): `BENCH_ONLY=reset cargo
        // bench --bench provision`; its table goes to target/bench/reset.md.
        controller.stop().await;
        let controller = start_controller(&bench.env, reset_config(&bench.config)).await;
        eprintln!("bench: resets");
        let md = reset_report(&resets(&bench, iters).await);
        report_part("reset", &md, smoke);
        controller.stop().await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("fork") {
        // A fork of ~100 MiB against the checkpoint path and a new empty
        // sandbox: `BENCH_ONLY=fork cargo bench --bench provision`; its
        // table goes to target/bench/fork.md.
        controller.stop().await;
        let md = fork::compare(&bench, iters).await;
        report_part("fork", &md, smoke);
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("seed") {
        // Seeded requests against unseeded ones, cold and warm:
        // `BENCH_ONLY=seed cargo bench --bench provision`; its table goes to
        // target/bench/seed.md.
        controller.stop().await;
        let md = seed::compare(&bench, iters).await;
        report_part("seed", &md, smoke);
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("swarm") {
        // One host against a single-node Swarm (made for the run and left
        // after): `BENCH_ONLY=swarm cargo bench --bench provision`; its
        // table goes to target/bench/swarm.md.
        controller.stop().await;
        let md = swarm::compare(&bench, iters).await;
        report_part("swarm", &md, smoke);
        return;
    }
    // `BENCH_ONLY=mix`, `mix-heals` or `chaos`: one part of the mix alone,
    // against a floor measured first (BENCH_ITERS containers per engine);
    // its table goes to target/bench/<part>.md.
    if let Ok(part @ ("mix" | "mix-heals" | "chaos")) = std::env::var("BENCH_ONLY").as_deref() {
        controller.stop().await;
        eprintln!("bench: the floor");
        let floors = mix::Floors::measure(&mut bench, iters).await;
        let controller = start_controller(&bench.env, mix::demand_config(&bench.config)).await;
        let entries = mix::mix(smoke);
        let md = match part {
            "mix" => mix::requests(&bench, &controller, &entries, iters)
                .await
                .report(&floors),
            "mix-heals" => mix::heals(&bench, &controller, &entries, heal_iters)
                .await
                .report(&floors),
            _ => mix::chaos(&bench, &controller, &entries, chaos_for)
                .await
                .report(&floors),
        };
        report_part(part, &md, smoke);
        controller.stop().await;
        return;
    }

    eprintln!("bench: warm-up");
    for e in [postgres, redis] {
        bench.floor(e, 1).await;
        bench.sandboxd(e.name().as_str(), 1).await;
    }
    let valkey = engine::lookup("valkey").expect("valkey engine");
    let pg = scenario(&mut bench, postgres, 1, iters).await;
    let rd = scenario(&mut bench, redis, 1, iters).await;
    let vk = scenario(&mut bench, valkey, 1, iters).await;
    let many = scenario(&mut bench, postgres, batch_size, batch_iters).await;
    eprintln!("bench: heals without templates");
    let heal_cold = heals(&bench, "postgres", iters, None).await;
    eprintln!("bench: resume of paused sandboxes");
    let resumed = [
        resumes(&mut bench, postgres, iters).await,
        resumes(&mut bench, redis, iters).await,
    ];
    controller.stop().await;

    // Templates (the default of `sandboxd run`).
    let mut with_templates = bench.config.clone();
    with_templates.templates = true;
    let controller = start_controller(&bench.env, with_templates.clone()).await;
    templates_built(&controller, 1.0).await;
    bench.sandboxd("postgres", 1).await;
    let mut tpl = scenario(&mut bench, postgres, 1, iters).await;
    tpl.row.scenario = format!("postgres from a template, 1 sandbox (n={iters})");
    tpl.column = "postgres, template".into();
    eprintln!("bench: heals with templates");
    let heal_tpl = heals(&bench, "postgres", iters, None).await;
    controller.stop().await;

    // A warm pool of one container per engine (templates on).
    let mut with_pool = with_templates.clone();
    with_pool.warm_pool = sandboxd::config::warm_pools(&["postgres=1".into(), "redis=1".into()])
        .expect("pool configuration");
    let controller = start_controller(&bench.env, with_pool).await;
    let pool_pg = pool_hits(&bench, &controller, "postgres", iters).await;
    let pool_rd = pool_hits(&bench, &controller, "redis", iters).await;
    eprintln!("bench: heals with a pool");
    let heal_pool = heals(&bench, "postgres", iters, Some(&controller)).await;
    controller.stop().await;

    // Cold starts and claims under gVisor (`--runtime runsc`). Not in the
    // smoke run: a fifth of its time, and the gVisor integration tests run
    // the same engines under runsc (`BENCH_ONLY=gvisor` runs these rows).
    let gvisor = if smoke {
        eprintln!("bench: gVisor rows skipped in the smoke run (BENCH_ONLY=gvisor runs them)");
        None
    } else {
        eprintln!("bench: gVisor");
        gvisor_rows(&mut bench, &[postgres, redis], iters).await
    };

    // The mix against warm pools learned from demand (templates on).
    let controller = start_controller(&bench.env, mix::demand_config(&bench.config)).await;
    let floors = mix::Floors::from_scenarios(&pg, &rd);
    let entries = mix::mix(smoke);
    eprintln!("bench: the mix");
    let mix_requests = mix::requests(&bench, &controller, &entries, iters).await;
    eprintln!("bench: heals of the mix");
    let mix_heals = mix::heals(&bench, &controller, &entries, heal_iters).await;
    eprintln!("bench: chaos");
    let chaos = mix::chaos(&bench, &controller, &entries, chaos_for).await;
    controller.stop().await;

    // Resets to a checkpoint (a larger memory cap for the 100 MB table).
    let controller = start_controller(&bench.env, reset_config(&bench.config)).await;
    eprintln!("bench: resets");
    let reset = resets(&bench, iters).await;
    controller.stop().await;

    // An idle fleet under production relist timing.
    let mut production = with_templates;
    production.relist_interval =
        ControllerConfig::new(bench.env.deployment.clone()).relist_interval;
    production.memory_budget = Some(IDLE_BUDGET);
    let controller = start_controller(&bench.env, production).await;
    templates_built(&controller, 1.0).await;
    let idle = idle_fleet(
        &bench,
        &controller,
        &[("postgres", idle_each), ("redis", idle_each)],
        idle_hold,
    )
    .await;
    controller.stop().await;

    // One host next to a single-node Swarm. Not in the smoke pass: it
    // makes this engine a Swarm, which the tests running beside that pass
    // must not see (`BENCH_ONLY=swarm` runs it alone).
    let swarm = if smoke {
        eprintln!("bench: smoke run: the Swarm comparison is left out (it would make this engine a Swarm under the tests beside it); BENCH_ONLY=swarm runs it");
        String::new()
    } else {
        swarm::compare(&bench, iters).await
    };

    let mut md = report(
        &[&pg, &rd, &vk, &tpl, &many],
        batch_size,
        bench.config.concurrency,
    );
    md.push_str(&heal_report(
        &pg,
        &[
            ("cold (no template, no pool)", &heal_cold),
            ("from a template", &heal_tpl),
            ("from the warm pool", &heal_pool),
        ],
    ));
    md.push_str(&pool_report(&[
        ("postgres", &pg, &pool_pg),
        ("redis", &rd, &pool_rd),
    ]));
    if let Some(rows) = &gvisor {
        md.push_str(&gvisor_report(rows, &[&pg, &rd]));
    }
    md.push_str(&mix_requests.report(&floors));
    md.push_str(&mix_heals.report(&floors));
    md.push_str(&chaos.report(&floors));
    md.push_str(&resume_report(&resumed));
    md.push_str(&reset_report(&reset));
    md.push_str(&idle_report(&idle));
    md.push_str(&swarm);
    md.push_str(&targets(&Figures {
        cold_pg: &pg,
        template: &tpl,
        burst: &many,
        heal_cold: &heal_cold,
        heal_template: &heal_tpl,
        heal_pool: &heal_pool,
        pool: &[("postgres", &pg, &pool_pg), ("redis", &rd, &pool_rd)],
        idle: &idle,
        mix: [mix_requests.targets(), mix_heals.targets(), chaos.targets()].concat(),
    }));
    println!("{md}");
    if smoke {
        return;
    }
    let path = output_path();
    std::fs::create_dir_all(path.parent().expect("parent")).expect("create output dir");
    std::fs::write(&path, &md).expect("write report");
    eprintln!(
        "bench: wrote {} in {:.0}s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
}

fn main() {
    init_tracing();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run());
}
