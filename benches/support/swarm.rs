//! One host against Swarm (`BENCH_ONLY=swarm`): the same requests served
//! by the Docker backend and by the Swarm backend on a single-node Swarm
//! of this engine (made for the run, with a closed gateway bridge, and
//! left after; `--swarm-publish host`, so that the bench, on the host,
//! reaches both the same way). Per backend, one controller at a time: a
//! warm pool of one per engine (claims), then neither pool nor template
//! (cold starts, and heals after `docker kill` of the engine's container or
//! task), then a Postgres template (starts and heals from it; under Swarm
//! built on the node by a global job). Request to ready
//! seen by the client, medians of `iters`, each backend's figure next to
//! the other's.

use super::{
    common, heals_of, median, pool_hits, start_controller, templates_built, Bench, READY_TIMEOUT,
};
use sandboxd::config::{warm_pools, Backend, ControllerConfig};
use sandboxd::domain::SandboxId;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

/// The figures of one backend, by measure.
#[derive(Default)]
struct Figures(Vec<(&'static str, Vec<Duration>)>);

/// The running task container of the sandbox `id`'s one service.
pub(super) async fn task_of(bench: &Bench, id: &SandboxId) -> String {
    use bollard::query_parameters::{ListContainersOptionsBuilder, ListServicesOptionsBuilder};
    let filters = HashMap::from([("label", vec![format!("io.sandboxd.sandbox={id}")])]);
    let services = bench
        .env
        .docker
        .list_services(Some(
            ListServicesOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list services");
    let service = services
        .first()
        .and_then(|s| s.id.clone())
        .unwrap_or_else(|| panic!("a service of {id}"));
    let filters = HashMap::from([
        (
            "label",
            vec![format!("com.docker.swarm.service.id={service}")],
        ),
        ("status", vec!["running".to_owned()]),
    ]);
    let tasks = bench
        .env
        .docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list task containers");
    tasks
        .first()
        .and_then(|c| c.id.clone())
        .unwrap_or_else(|| panic!("a running task of {id}"))
}

/// Starts a controller of `bench`'s deployment with `config` on `backend`.
async fn start(
    bench: &Bench,
    config: ControllerConfig,
    backend: Backend,
) -> common::RunningController {
    if backend == Backend::Docker {
        return start_controller(&bench.env, config).await;
    }
    let (controller, _) = bench.env.start_on_swarm(config).await;
    common::eventually("controller ready", READY_TIMEOUT, || async {
        controller.readiness.is_ready().then_some(())
    })
    .await;
    controller
}

/// Claims, cold starts, template starts and heals on `backend`.
async fn measure(bench: &Bench, iters: usize, backend: Backend) -> Figures {
    let mut figures = Figures::default();
    let mut base = bench.config.clone();
    base.templates = false;

    let mut pooled = base.clone();
    pooled.warm_pool =
        warm_pools(&["postgres=1".to_owned(), "redis=1".to_owned()]).expect("pool sizes");
    let controller = start(bench, pooled, backend).await;
    for (measure, engine) in [("claim, postgres", "postgres"), ("claim, redis", "redis")] {
        eprintln!("bench: {backend:?}: {measure}");
        let times = pool_hits(bench, &controller, engine, iters).await;
        figures.0.push((measure, times));
    }
    controller.stop().await;

    let controller = start(bench, base.clone(), backend).await;
    for (measure, engine) in [("cold, postgres", "postgres"), ("cold, redis", "redis")] {
        eprintln!("bench: {backend:?}: {measure}");
        bench.sandboxd(engine, 1).await;
        let mut times = Vec::new();
        for _ in 0..iters {
            let (t0, _, done) = bench.sandboxd(engine, 1).await;
            times.extend(done.iter().map(|(_, end)| *end - t0));
        }
        figures.0.push((measure, times));
    }
    eprintln!("bench: {backend:?}: heals");
    let heals = heals_of(bench, "postgres", iters, None, backend == Backend::Swarm).await;
    figures.0.push(("heal after kill, postgres", heals));
    controller.stop().await;

    let mut templated = base;
    templated.templates = true;
    let controller = start(bench, templated, backend).await;
    templates_built(&controller, 1.0).await;
    eprintln!("bench: {backend:?}: template starts and heals");
    bench.sandboxd("postgres", 1).await;
    let mut times = Vec::new();
    for _ in 0..iters {
        let (t0, _, done) = bench.sandboxd("postgres", 1).await;
        times.extend(done.iter().map(|(_, end)| *end - t0));
    }
    figures.0.push(("from a template, postgres", times));
    let heals = heals_of(bench, "postgres", iters, None, backend == Backend::Swarm).await;
    figures
        .0
        .push(("heal after kill from a template, postgres", heals));
    controller.stop().await;
    figures
}

/// The comparison's table.
pub(super) async fn compare(bench: &Bench, iters: usize) -> String {
    let host = measure(bench, iters, Backend::Docker).await;
    let swarm = {
        let _swarm = common::SingleNodeSwarm::join();
        measure(bench, iters, Backend::Swarm).await
    };
    report(&host, &swarm, iters)
}

fn report(host: &Figures, swarm: &Figures, iters: usize) -> String {
    let p50 = |f: &Figures, measure: &str| {
        f.0.iter()
            .find(|(m, _)| *m == measure)
            .filter(|(_, t)| !t.is_empty())
            .map(|(_, t)| median(t))
    };
    let mut md = String::new();
    let _ = writeln!(md, "\n## One host and Swarm\n");
    let _ = writeln!(
        md,
        "`BENCH_ONLY=swarm`: the same requests on the Docker backend and on a single-node Swarm of the same engine (`--swarm-publish host`, sandboxd on the host), one controller at a time: a warm pool of one per engine (claims, each once the pool refilled), then neither pool nor template (cold starts; heals after `docker kill` of the engine's container or task, Postgres), then a Postgres template (starts, and heals, from it; on Swarm built on the node by a global job, see docs/swarm.md, \"Templates\"). Request (or kill) to ready seen by the client, medians of n = {iters}. A claim on Swarm is made by a new sandbox's first engine (see docs/swarm.md, \"Warm pools\").\n"
    );
    let _ = writeln!(
        md,
        "| measure | one host p50 ms | Swarm p50 ms | Swarm / one host |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|");
    let ms = |d: Option<Duration>| d.map_or("–".to_owned(), |d| d.as_millis().to_string());
    for (measure, _) in &host.0 {
        let (h, s) = (p50(host, measure), p50(swarm, measure));
        let ratio = match (h, s) {
            (Some(h), Some(s)) if !h.is_zero() => {
                format!("{:.2}", s.as_secs_f64() / h.as_secs_f64())
            }
            _ => "–".to_owned(),
        };
        let _ = writeln!(md, "| {measure} | {} | {} | {ratio} |", ms(h), ms(s));
    }
    md
}
