//! The realistic mix (issue 28): the requests agents make, Postgres plain
//! and with extensions, Redis with and without search, against a
//! controller that learns its warm pools from demand
//! ([`ControllerConfig::warm_pool_demand`]). Three parts, each against the
//! cold floor of the same run (bare create+start+readiness per engine):
//!
//! - [`requests`]: request to `ready` over the mix once the pools have seen it;
//! - [`heals`]: heal after `docker kill`, `docker rm -f` and `docker stop`
//!   of every entry of the mix;
//! - [`chaos`]: a chaos run through `sandboxd chaos`'s library
//!   ([`sandboxd::chaos`]) while rows churn, one sandbox of it hit again and
//!   again.
//!
//! Faults go through the injector `sandboxd chaos` uses, victims are
//! chosen by container name (a container claimed from a pool keeps the
//! pool's labels). Nothing here panics on a slow or missing heal: it is
//! counted as unhealed and shows in the table as a missed target.

use super::{common, median, Bench, Scenario, GONE_TIMEOUT, READY_TIMEOUT, SETTLE};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use sandboxd::adapters::chaos::{Fault, Injector};
use sandboxd::adapters::PgStore;
use sandboxd::chaos::{Chaos, ChaosOptions, FaultRecord, Report, MAX_FAULTS};
use sandboxd::client::{Client, SandboxRequest};
use sandboxd::config::{ControllerConfig, PoolDemand};
use sandboxd::domain::{Phase, SandboxId, ServiceStatus};
use sandboxd::engine;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one heal of parts b may take before it counts as unhealed.
const HEAL_BOUND: Duration = Duration::from_secs(60);
/// How long a measured request or fault waits for the pools to refill.
const REFILL_BOUND: Duration = Duration::from_secs(30);
/// The faults of parts b and c: an operator's, none the engine's own.
const FAULTS: [Fault; 3] = [Fault::Kill, Fault::Remove, Fault::Stop];

/// One request of the mix: an engine and the features it asks for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    engine: &'static str,
    features: &'static [&'static str],
}

/// What agents ask for.
const MIX: &[Entry] = &[
    Entry {
        engine: "postgres",
        features: &[],
    },
    Entry {
        engine: "postgres",
        features: &["pg_trgm"],
    },
    Entry {
        engine: "postgres",
        features: &["vector"],
    },
    Entry {
        engine: "postgres",
        features: &["vector", "postgis"],
    },
    Entry {
        engine: "redis",
        features: &[],
    },
    Entry {
        engine: "redis",
        features: &["search"],
    },
];

/// The mix of a run: all of it, or for a smoke run one entry with a
/// feature per engine.
pub(super) fn mix(smoke: bool) -> Vec<Entry> {
    if smoke {
        vec![MIX[1], MIX[5]]
    } else {
        MIX.to_vec()
    }
}

impl Entry {
    fn label(&self) -> String {
        if self.features.is_empty() {
            format!("{} plain", self.engine)
        } else {
            format!("{} {}", self.engine, self.features.join("+"))
        }
    }

    fn request(&self) -> SandboxRequest {
        let mut r = super::request(self.engine);
        if !self.features.is_empty() {
            r.features.insert(
                self.engine.to_owned(),
                self.features.iter().map(|f| (*f).to_owned()).collect(),
            );
        }
        r
    }

    fn engine(&self) -> &'static dyn engine::Engine {
        engine::lookup(self.engine).expect("an engine of the mix")
    }
}

/// The controller of the three parts: templates on (`sandboxd run`'s
/// default) and warm pools learned from demand, at most 8 containers for
/// the feature sets requested in the last 10 minutes.
pub(super) fn demand_config(base: &ControllerConfig) -> ControllerConfig {
    let mut c = base.clone();
    c.templates = true;
    c.warm_pool_demand = PoolDemand {
        max: 8,
        window: Duration::from_secs(600),
    };
    c
}

// ---------------------------------------------------------------------------
// The floor.

/// The cold floor of each engine of the mix: median bare
/// create+start+readiness of its plain image, measured in the same run.
pub(super) struct Floors(BTreeMap<&'static str, Duration>);

impl Floors {
    /// From the cold scenarios of a full run.
    pub(super) fn from_scenarios(postgres: &Scenario, redis: &Scenario) -> Self {
        Self(BTreeMap::from([
            ("postgres", median(&postgres.floor_totals)),
            ("redis", median(&redis.floor_totals)),
        ]))
    }

    /// Measured now (a part run alone): `iters` floor containers per engine.
    pub(super) async fn measure(bench: &mut Bench, iters: usize) -> Self {
        let mut out = BTreeMap::new();
        for name in ["postgres", "redis"] {
            let e = engine::lookup(name).expect("engine");
            let mut totals = Vec::new();
            for _ in 0..iters {
                let (_, runs) = bench.floor(e, 1).await;
                totals.extend(runs.iter().map(|r| r.total));
                tokio::time::sleep(SETTLE).await;
            }
            out.insert(name, median(&totals));
        }
        Self(out)
    }

    fn of(&self, engine: &str) -> Duration {
        self.0.get(engine).copied().unwrap_or_default()
    }

    fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(e, d)| format!("{e} {:.3} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// ---------------------------------------------------------------------------
// The pools, read off the controller's metrics.

/// The sum of every series of `name` whose labels include `labels`.
fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Pool containers ready and being created, over every engine and feature set.
fn pool_counts(controller: &common::RunningController) -> (f64, f64) {
    let text = controller.metrics.render();
    let count = |state| metric_sum(&text, "sandboxd_pool_size", &[("state", state)]);
    (count("ready"), count("creating"))
}

/// Claims of `kind` (`create`, `heal`) that hit or missed a pool.
fn claims(controller: &common::RunningController, kind: &str) -> (f64, f64) {
    let text = controller.metrics.render();
    let count = |result| {
        metric_sum(
            &text,
            "sandboxd_pool_claims_total",
            &[("result", result), ("kind", kind)],
        )
    };
    (count("hit"), count("miss"))
}

/// Waits, at most [`REFILL_BOUND`], until no pool container is being
/// created and at least `ready` are ready; whether that happened.
async fn refilled(controller: &common::RunningController, ready: f64) -> bool {
    let t0 = Instant::now();
    loop {
        let (r, creating) = pool_counts(controller);
        if creating == 0.0 && r >= ready {
            return true;
        }
        if t0.elapsed() > REFILL_BOUND {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Lets the pools see the mix: one sandbox of each entry, then waits until
/// they stop changing (nothing being created and the same number ready for
/// 3 s; at most 5 minutes). The number ready then.
async fn warm_up(bench: &Bench, controller: &common::RunningController, mix: &[Entry]) -> f64 {
    eprintln!("bench: the mix, warm-up pass");
    for entry in mix {
        provision_once(bench, entry).await;
    }
    let t0 = Instant::now();
    let mut last = -1.0;
    let mut since = Instant::now();
    loop {
        let (ready, creating) = pool_counts(controller);
        if creating > 0.0 || ready != last {
            last = ready;
            since = Instant::now();
        } else if since.elapsed() >= Duration::from_secs(3) || t0.elapsed() > READY_TIMEOUT * 2 {
            eprintln!(
                "bench: pools settled with {ready} ready in {:.0}s",
                t0.elapsed().as_secs_f64()
            );
            return ready;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Provisions one sandbox of `entry`, releases it once ready and waits
/// until it is gone: request to ready seen by the client.
async fn provision_once(bench: &Bench, entry: &Entry) -> Duration {
    let id = common::sandbox_id("bench-mix");
    let t0 = Instant::now();
    let status = bench
        .client
        .provision(&id, &entry.request(), READY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("sandbox {id} ({}): {e}", entry.label()));
    let took = t0.elapsed();
    assert_eq!(status.phase, Phase::Ready);
    release(bench, &[id]).await;
    took
}

/// Releases `ids` and waits until their containers and statuses are gone.
async fn release(bench: &Bench, ids: &[SandboxId]) {
    for id in ids {
        bench.client.release(id).await.expect("release");
    }
    for id in ids {
        common::eventually("teardown", GONE_TIMEOUT, || async {
            let status = bench.client.status(id).await.expect("status");
            let containers = bench.env.containers(Some(id)).await;
            (status.is_none() && containers.is_empty()).then_some(())
        })
        .await;
    }
}

/// The nearest-rank `q` quantile.
fn quantile(values: &[Duration], q: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn yes(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "**no**"
    }
}

/// A target of the Targets table: what, measured, met.
pub(super) type Target = (String, String, bool);

// ---------------------------------------------------------------------------
// a. Request to ready over the mix.

/// Request-to-ready over the mix.
pub(super) struct Requests {
    /// Per entry: request to ready seen by the client.
    times: Vec<(Entry, Vec<Duration>)>,
    /// Pool containers ready once the pools had seen the mix.
    learned: f64,
    /// Creates served by a pool and not, while measuring.
    hits: f64,
    misses: f64,
    /// Measured requests made before the pools had refilled (they did not
    /// within 30 s).
    unrefilled: usize,
}

/// A warm-up pass, then `passes` passes over the mix, each in another
/// random order (seeded), each request once the pools have refilled.
pub(super) async fn requests(
    bench: &Bench,
    controller: &common::RunningController,
    mix: &[Entry],
    passes: usize,
) -> Requests {
    let learned = warm_up(bench, controller, mix).await;
    let (hits0, misses0) = claims(controller, "create");
    let mut out = Requests {
        times: mix.iter().map(|e| (*e, Vec::new())).collect(),
        learned,
        hits: 0.0,
        misses: 0.0,
        unrefilled: 0,
    };
    let mut rng = StdRng::seed_from_u64(28);
    for pass in 0..passes {
        let mut order: Vec<usize> = (0..mix.len()).collect();
        order.shuffle(&mut rng);
        for i in order {
            if !refilled(controller, learned).await {
                out.unrefilled += 1;
            }
            tokio::time::sleep(SETTLE).await;
            let took = provision_once(bench, &mix[i]).await;
            out.times[i].1.push(took);
        }
        eprintln!("bench: the mix, pass {} of {passes}", pass + 1);
    }
    let (hits, misses) = claims(controller, "create");
    out.hits = hits - hits0;
    out.misses = misses - misses0;
    out
}

impl Requests {
    fn all(&self) -> Vec<Duration> {
        self.times.iter().flat_map(|(_, t)| t.clone()).collect()
    }

    pub(super) fn report(&self, floors: &Floors) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "\n## Request to ready, the mix, pools learned from demand\n"
        );
        let _ = writeln!(
            md,
            "A controller with warm pools learned from demand (at most 8 containers, window \
             10 min; templates on). A warm-up pass requests each entry of the mix once; once \
             the pools have settled ({} containers ready), the measured passes request the mix \
             interleaved (a new random order each pass), each request once the pools have \
             refilled (bounded at 30 s: {} were not), each sandbox released after. INSERT to \
             `ready` seen by the client. Pool claims while measuring: {} hits, {} misses. Cold \
             floor of this run (bare create+start+readiness, plain image): {}. Target: p50 under \
             100 ms and p99 under 250 ms.\n",
            self.learned,
            self.unrefilled,
            self.hits,
            self.misses,
            floors.describe()
        );
        let _ = writeln!(
            md,
            "| request | floor ms | p50 ms | p99 ms | max ms | p50 / floor | n | target |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|:---:|");
        // The mix's own row has no one floor: its engines differ.
        let mut rows: Vec<(String, Option<Duration>, Vec<Duration>)> = self
            .times
            .iter()
            .map(|(e, t)| (e.label(), Some(floors.of(e.engine)), t.clone()))
            .collect();
        rows.push(("**the mix**".into(), None, self.all()));
        for (label, floor, times) in rows {
            let (p50, p99) = (quantile(&times, 0.5), quantile(&times, 0.99));
            let max = times.iter().max().copied().unwrap_or_default();
            let met = p50 < Duration::from_millis(100) && p99 < Duration::from_millis(250);
            let (floor, ratio) = floor.map_or(("–".into(), "–".into()), |f| {
                (
                    format!("{:.0}", f.as_secs_f64() * 1e3),
                    format!("{:.2}", p50.as_secs_f64() / f.as_secs_f64().max(1e-9)),
                )
            });
            let _ = writeln!(
                md,
                "| {label} | {floor} | {:.0} | {:.0} | {:.0} | {ratio} | {} | {} |",
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3,
                times.len(),
                yes(met && !times.is_empty())
            );
        }
        md
    }

    pub(super) fn targets(&self) -> Vec<Target> {
        let all = self.all();
        let (p50, p99) = (quantile(&all, 0.5), quantile(&all, 0.99));
        vec![
            (
                "the mix with learned pools: request-to-ready p50 under 100 ms".into(),
                format!("{:.0} ms", p50.as_secs_f64() * 1e3),
                !all.is_empty() && p50 < Duration::from_millis(100),
            ),
            (
                "the mix with learned pools: request-to-ready p99 under 250 ms".into(),
                format!("{:.0} ms", p99.as_secs_f64() * 1e3),
                !all.is_empty() && p99 < Duration::from_millis(250),
            ),
        ]
    }
}

// ---------------------------------------------------------------------------
// b. Heals of every entry after kill, rm -f and stop.

/// Heals of one entry after one kind of fault.
struct HealRow {
    entry: Entry,
    fault: Fault,
    /// From the fault until the status said ready with one more heal.
    times: Vec<Duration>,
    /// Faults not healed within 60 s, or that ended in `failed`.
    unhealed: usize,
    /// Heals that published other credentials (or another endpoint on the
    /// sandbox's network).
    changed: usize,
    /// Heals that kept those but published another `host_port` (served by
    /// a pool: see `ServiceStatus::credential_changes`).
    moved: usize,
}

/// Heals after `docker kill`, `docker rm -f` and `docker stop`.
pub(super) struct Heals {
    rows: Vec<HealRow>,
    /// Heals served by a pool and not.
    hits: f64,
    misses: f64,
}

/// Waits until `engine` of `id` is ready with more than `heals` heals,
/// from `t0`: the time and its new entry, or why not.
async fn healed(
    client: &Client,
    id: &SandboxId,
    engine: &str,
    heals: u32,
    t0: Instant,
) -> Result<(Duration, ServiceStatus), String> {
    loop {
        let s = client.status(id).await.map_err(|e| e.to_string())?;
        if let Some(s) = &s {
            if let Some(service) = s.services.get(engine) {
                if s.phase == Phase::Ready && service.heals > heals {
                    return Ok((t0.elapsed(), (**service).clone()));
                }
            }
            if s.phase == Phase::Failed {
                return Err(format!("failed: {}", s.message));
            }
        }
        if t0.elapsed() > HEAL_BOUND {
            return Err(format!(
                "not healed within {HEAL_BOUND:?}: {}",
                s.map_or("no status".into(), |s| format!(
                    "{:?}: {}",
                    s.phase, s.message
                ))
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `iters` times for each entry of the mix: a sandbox hit by each of
/// [`FAULTS`] in turn (a new order each time, each fault once the previous
/// heal is ready and the pools have refilled), then released. Three heals
/// per sandbox, fewer than a crash loop takes.
pub(super) async fn heals(
    bench: &Bench,
    controller: &common::RunningController,
    mix: &[Entry],
    iters: usize,
) -> Heals {
    let learned = warm_up(bench, controller, mix).await;
    let (hits0, misses0) = claims(controller, "heal");
    let injector = Injector::new((*bench.env.runtime).clone());
    let mut rows: Vec<HealRow> = mix
        .iter()
        .flat_map(|e| {
            FAULTS.iter().map(|f| HealRow {
                entry: *e,
                fault: *f,
                times: Vec::new(),
                unhealed: 0,
                changed: 0,
                moved: 0,
            })
        })
        .collect();
    for i in 0..iters {
        for (e, entry) in mix.iter().enumerate() {
            let id = common::sandbox_id("bench-mixheal");
            let status = bench
                .client
                .provision(&id, &entry.request(), READY_TIMEOUT)
                .await
                .unwrap_or_else(|err| panic!("sandbox {id} ({}): {err}", entry.label()));
            let mut service = (*status.services[entry.engine]).clone();
            let victim = sandboxd::domain::network::container_name(
                &bench.config.deployment,
                &id,
                entry.engine().name(),
            );
            // A smoke run (`cargo test`) proves each fault once over the mix.
            let faults = if bench.smoke { 1 } else { FAULTS.len() };
            for f in 0..faults {
                let k = (f + i + e) % FAULTS.len();
                let row = &mut rows[e * FAULTS.len() + k];
                refilled(controller, learned).await;
                tokio::time::sleep(SETTLE).await;
                let t0 = Instant::now();
                injector
                    .inject(FAULTS[k], &victim, entry.engine().data_path())
                    .await
                    .unwrap_or_else(|err| panic!("{} {victim}: {err}", FAULTS[k].as_str()));
                match healed(&bench.client, &id, entry.engine, service.heals, t0).await {
                    Ok((took, after)) => {
                        row.times.push(took);
                        let changed = service.credential_changes(&after);
                        if !changed.is_empty() {
                            eprintln!(
                                "bench: {} after {}: other {changed:?}",
                                entry.label(),
                                FAULTS[k].as_str()
                            );
                            row.changed += 1;
                        } else if service.host_port != after.host_port {
                            row.moved += 1;
                        }
                        service = after;
                    }
                    Err(why) => {
                        eprintln!(
                            "bench: {} after {}: {why}",
                            entry.label(),
                            FAULTS[k].as_str()
                        );
                        row.unhealed += 1;
                        break;
                    }
                }
            }
            release(bench, &[id]).await;
        }
        eprintln!("bench: heals of the mix, round {} of {iters}", i + 1);
    }
    let (hits, misses) = claims(controller, "heal");
    Heals {
        rows,
        hits: hits - hits0,
        misses: misses - misses0,
    }
}

/// The heal target: p50 under 0.5 s, p95 under 1 s, nothing unhealed.
fn heal_met(times: &[Duration], unhealed: usize) -> bool {
    !times.is_empty()
        && unhealed == 0
        && quantile(times, 0.5) < Duration::from_millis(500)
        && quantile(times, 0.95) < Duration::from_secs(1)
}

impl Heals {
    fn all(&self) -> (Vec<Duration>, usize) {
        (
            self.rows.iter().flat_map(|r| r.times.clone()).collect(),
            self.rows.iter().map(|r| r.unhealed).sum(),
        )
    }

    pub(super) fn report(&self, floors: &Floors) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "\n## Heal after `docker kill`, `docker rm -f` and `docker stop`, the mix\n"
        );
        let _ = writeln!(
            md,
            "The controller of the mix table. For each entry, a sandbox is hit by each fault in \
             turn (`docker kill`; `docker rm -f`; `docker stop -t 1`, the order rotating; each \
             once the previous heal is ready and the pools have refilled), by container name, \
             through `sandboxd chaos`'s injector; then released. From the fault until the status \
             says ready with one more heal; unhealed: not within 60 s, or `failed`. Heals served \
             by a pool: {} hits, {} misses. Credentials changed: another user, password, \
             database, URL, environment or address on the sandbox's network (none may); host \
             port moved: the same credentials on another `host_port`, which a heal served by \
             the pool publishes (Docker binds a container's ports when it is created). Cold floor of this run (bare \
             create+start+readiness, plain image): {}. Target: p50 under 0.5 s and p95 under \
             1 s, none unhealed.\n",
            self.hits,
            self.misses,
            floors.describe()
        );
        let _ = writeln!(
            md,
            "| request | fault | p50 s | p95 s | max s | p50 / floor | n | unhealed | credentials changed | host port moved | target |"
        );
        let _ = writeln!(
            md,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"
        );
        for r in &self.rows {
            let (p50, p95) = (quantile(&r.times, 0.5), quantile(&r.times, 0.95));
            let max = r.times.iter().max().copied().unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {} | {} | {} | {} | {} |",
                r.entry.label(),
                r.fault.as_str(),
                p50.as_secs_f64(),
                p95.as_secs_f64(),
                max.as_secs_f64(),
                p50.as_secs_f64() / floors.of(r.entry.engine).as_secs_f64().max(1e-9),
                r.times.len(),
                r.unhealed,
                r.changed,
                r.moved,
                yes(heal_met(&r.times, r.unhealed) && r.changed == 0)
            );
        }
        let (all, unhealed) = self.all();
        let changed: usize = self.rows.iter().map(|r| r.changed).sum();
        let moved: usize = self.rows.iter().map(|r| r.moved).sum();
        let max = all.iter().max().copied().unwrap_or_default();
        let _ = writeln!(
            md,
            "| **every heal** | all | {:.3} | {:.3} | {:.3} | – | {} | {unhealed} | {changed} | {moved} | {} |",
            quantile(&all, 0.5).as_secs_f64(),
            quantile(&all, 0.95).as_secs_f64(),
            max.as_secs_f64(),
            all.len(),
            yes(heal_met(&all, unhealed) && changed == 0)
        );
        md
    }

    pub(super) fn targets(&self) -> Vec<Target> {
        let (all, unhealed) = self.all();
        let (p50, p95) = (quantile(&all, 0.5), quantile(&all, 0.95));
        vec![
            (
                "heal of the mix after kill, rm -f, stop: p50 under 0.5 s".into(),
                format!("{:.3} s", p50.as_secs_f64()),
                !all.is_empty() && p50 < Duration::from_millis(500),
            ),
            (
                "heal of the mix after kill, rm -f, stop: p95 under 1 s, none unhealed".into(),
                format!("{:.3} s, {unhealed} unhealed", p95.as_secs_f64()),
                !all.is_empty() && unhealed == 0 && p95 < Duration::from_secs(1),
            ),
            (
                "heal of the mix: the same credentials every time".into(),
                format!(
                    "{} changed",
                    self.rows.iter().map(|r| r.changed).sum::<usize>()
                ),
                self.rows.iter().all(|r| r.changed == 0),
            ),
        ]
    }
}

// ---------------------------------------------------------------------------
// c. A chaos run with churn, one sandbox hit again and again.

/// What the chaos run found.
pub(super) struct ChaosRun {
    duration: Duration,
    report: Report,
    /// The sandbox hit again and again, and what became of each hit.
    pinned: String,
    pinned_records: Vec<FaultRecord>,
    /// Sandboxes of the fleet whose published credentials changed, or that
    /// were not ready at the end.
    changed: Vec<String>,
    /// Sandboxes of the fleet that kept their credentials on another
    /// `host_port` (healed from the pool).
    moved: Vec<String>,
    /// Rows inserted and released meanwhile.
    inserted: usize,
    released: usize,
}

/// Inserts a row of the mix every 6 s and releases the oldest of them
/// every other time, until `until`; the rows it left.
async fn churn(client: Client, mix: Vec<Entry>, until: Instant) -> (Vec<SandboxId>, usize, usize) {
    let mut rows: Vec<SandboxId> = Vec::new();
    let (mut inserted, mut released) = (0, 0);
    let mut step = 0;
    while Instant::now() + Duration::from_secs(6) < until {
        tokio::time::sleep(Duration::from_secs(6)).await;
        let id = common::sandbox_id("bench-churn");
        client
            .apply(&id, &mix[step % mix.len()].request())
            .await
            .expect("churn apply");
        rows.push(id);
        inserted += 1;
        if step % 2 == 1 {
            client
                .release(&rows.remove(0))
                .await
                .expect("churn release");
            released += 1;
        }
        step += 1;
    }
    (rows, inserted, released)
}

/// A fleet of one sandbox per entry of the mix (the pools warmed up
/// first); for `duration`, `sandboxd chaos`'s run injects random kills,
/// stops and removals (one every 4 s) while rows churn, and one sandbox
/// (Postgres with a feature, the case of issue 28) is hit again and again,
/// each fault once the previous heal is ready. Then the run's invariants,
/// and whether the fleet's credentials stayed the same.
pub(super) async fn chaos(
    bench: &Bench,
    controller: &common::RunningController,
    mix: &[Entry],
    duration: Duration,
) -> ChaosRun {
    warm_up(bench, controller, mix).await;
    let fleet: Vec<(SandboxId, Entry)> = mix
        .iter()
        .map(|e| (common::sandbox_id("bench-chaos"), *e))
        .collect();
    let ready = futures::future::join_all(fleet.iter().map(|(id, e)| async move {
        bench
            .client
            .provision(id, &e.request(), READY_TIMEOUT)
            .await
            .unwrap_or_else(|err| panic!("sandbox {id} ({}): {err}", e.label()))
    }))
    .await;
    let before: Vec<_> = ready.iter().map(|s| s.services.clone()).collect();
    let pinned = fleet
        .iter()
        .find(|(_, e)| e.engine == "postgres" && !e.features.is_empty())
        .unwrap_or(&fleet[0])
        .0
        .clone();

    let store = Arc::new(PgStore::with_engines(
        bench.env.pool.clone(),
        sandboxd::engine::REGISTRY,
    ));
    let faults = ((duration.as_secs() / 4) as usize).clamp(1, MAX_FAULTS);
    let run = Arc::new(
        Chaos::new(
            (*bench.env.runtime).clone(),
            store,
            ChaosOptions {
                deployment: bench.config.deployment.clone(),
                faults,
                duration,
                kinds: FAULTS.to_vec(),
                seed: rand::random(),
                settle: Duration::from_secs(60),
            },
        )
        .expect("chaos options"),
    );
    let others = run
        .others()
        .await
        .expect("the other deployments' containers");
    let until = Instant::now() + duration;
    eprintln!(
        "bench: chaos for {}s, {faults} random faults, {pinned} hit again and again",
        duration.as_secs()
    );
    let random = tokio::spawn({
        let run = run.clone();
        async move { run.inject().await }
    });
    let churned = tokio::spawn(churn(bench.client.clone(), mix.to_vec(), until));
    let pinned_run = tokio::spawn({
        let (run, pinned) = (run.clone(), pinned.clone());
        async move {
            let mut records = Vec::new();
            let mut k = 0;
            while Instant::now() < until {
                match run.hit(FAULTS[k % FAULTS.len()], &pinned, k as u64).await {
                    Ok(Some(record)) => {
                        if record.healed_after.is_none() {
                            eprintln!("bench: {pinned} not healed after {}", record.fault);
                        }
                        records.push(record);
                        k += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    // Not ready now (a random fault hit it too).
                    Ok(None) => tokio::time::sleep(Duration::from_millis(200)).await,
                    Err(e) => {
                        eprintln!("bench: chaos could not look at the fleet: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            records
        }
    });
    let mut records = random.await.expect("random faults");
    let pinned_records = pinned_run.await.expect("the pinned sandbox's faults");
    records.extend(pinned_records.iter().cloned());
    let (churn_rows, inserted, released) = churned.await.expect("churn");
    let report = run.check(records, &others).await.expect("chaos check");

    let mut changed = Vec::new();
    let mut moved = Vec::new();
    for ((id, entry), before) in fleet.iter().zip(&before) {
        let now = bench.client.status(id).await.expect("status");
        match now {
            Some(s) if s.phase == Phase::Ready => {
                let (Some(a), Some(b)) = (before.get(entry.engine), s.services.get(entry.engine))
                else {
                    changed.push(format!("{id}: no {} entry", entry.engine));
                    continue;
                };
                let fields = a.credential_changes(b);
                if !fields.is_empty() {
                    changed.push(format!("{id}: another {}", fields.join(", ")));
                } else if a.host_port != b.host_port {
                    moved.push(id.to_string());
                }
            }
            Some(s) => changed.push(format!("{id}: {:?}: {}", s.phase, s.message)),
            None => changed.push(format!("{id}: no status")),
        }
    }
    let mut ids: Vec<SandboxId> = fleet.into_iter().map(|(id, _)| id).collect();
    ids.extend(churn_rows);
    release(bench, &ids).await;
    ChaosRun {
        duration,
        report,
        pinned: pinned.to_string(),
        pinned_records,
        changed,
        moved,
        inserted,
        released,
    }
}

impl ChaosRun {
    fn lost(&self) -> usize {
        self.report.lost_credentials.len() + self.changed.len()
    }

    pub(super) fn report(&self, floors: &Floors) -> String {
        let r = &self.report;
        let mut md = String::new();
        let secs = self.duration.as_secs();
        let span = if secs % 60 == 0 && secs >= 120 {
            format!("{} minutes", secs / 60)
        } else {
            format!("{secs} s")
        };
        let _ = writeln!(
            md,
            "\n## Chaos: {span}, rows churning, one sandbox hit again and again\n"
        );
        let _ = writeln!(
            md,
            "The controller of the mix table; a fleet of one sandbox per entry of the mix. \
             `sandboxd chaos`'s run (`sandboxd::chaos`) injects a random `kill`, `stop -t 1` or \
             `rm -f` every 4 s into a ready engine; meanwhile a row of the mix is inserted every \
             6 s and every other time the oldest inserted is released, and one sandbox ({}: \
             Postgres with a feature) is hit again and again (kill, rm -f, stop in turn, each \
             once the previous heal is ready). Heal: from the fault until the status says ready \
             with one more heal (polled every 100 ms; unhealed: not within 2 minutes). Then the \
             run's invariants once the fleet settled (60 s at most). Lost credentials: a ready \
             status whose credentials do not log in, or a sandbox of the fleet whose published \
             credentials changed or that is not ready at the end (the same credentials on \
             another `host_port`, as a heal served by the pool publishes, are counted apart). Cold floor of this run: {}. \
             Target: 0 unhealed, 0 lost credentials, heal p50 under 1 s.\n",
            self.pinned,
            floors.describe()
        );
        let heals = |v: Option<f64>| v.map_or("n/a".into(), |s| format!("{s:.3} s"));
        let kinds: Vec<String> = r.faults.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let pinned_heals: Vec<Duration> = self
            .pinned_records
            .iter()
            .filter_map(|r| r.healed_after.map(Duration::from_secs_f64))
            .collect();
        let pinned_unhealed = self
            .pinned_records
            .iter()
            .filter(|r| r.error.is_none() && r.healed_after.is_none() && !r.released)
            .count();
        let p50_met = r.heal_p50.is_some_and(|s| s < 1.0);
        let _ = writeln!(md, "| measure | value | target |");
        let _ = writeln!(md, "|---|---:|:---:|");
        let rows: Vec<(String, String, &str)> = vec![
            (
                "faults injected".into(),
                format!("{} ({})", r.records.len(), kinds.join(", ")),
                "",
            ),
            (
                format!("of them into {}", self.pinned),
                format!(
                    "{} ({} healed, p50 {:.3} s, max {:.3} s)",
                    self.pinned_records.len(),
                    pinned_heals.len(),
                    quantile(&pinned_heals, 0.5).as_secs_f64(),
                    pinned_heals
                        .iter()
                        .max()
                        .copied()
                        .unwrap_or_default()
                        .as_secs_f64()
                ),
                yes(pinned_unhealed == 0 && !self.pinned_records.is_empty()),
            ),
            (
                "unhealed".into(),
                r.unhealed.to_string(),
                yes(r.unhealed == 0),
            ),
            (
                "lost credentials".into(),
                format!(
                    "{} ({} do not log in, {} of the fleet changed or not ready)",
                    self.lost(),
                    r.lost_credentials.len(),
                    self.changed.len()
                ),
                yes(self.lost() == 0),
            ),
            (
                "of the fleet: the same credentials on another host port".into(),
                self.moved.len().to_string(),
                "",
            ),
            ("heal p50".into(), heals(r.heal_p50), yes(p50_met)),
            ("heal p95".into(), heals(r.heal_p95), ""),
            ("heal max".into(), heals(r.heal_max), ""),
            (
                "after settling: unconverged, leaked, duplicate".into(),
                format!(
                    "{}, {}, {}",
                    r.unconverged.len(),
                    r.leaked.len(),
                    r.duplicate.len()
                ),
                yes(r.passed()),
            ),
            (
                "rows inserted, released while faulting".into(),
                format!("{}, {}", self.inserted, self.released),
                "",
            ),
        ];
        for (measure, value, met) in rows {
            let _ = writeln!(md, "| {measure} | {value} | {met} |");
        }
        if !self.changed.is_empty() {
            let _ = writeln!(md, "\nNot kept:\n");
        }
        for line in &self.changed {
            let _ = writeln!(md, "- {line}");
        }
        md
    }

    pub(super) fn targets(&self) -> Vec<Target> {
        let r = &self.report;
        vec![
            (
                "chaos with churn: 0 unhealed".into(),
                r.unhealed.to_string(),
                r.unhealed == 0,
            ),
            (
                "chaos with churn: 0 lost credentials".into(),
                self.lost().to_string(),
                self.lost() == 0,
            ),
            (
                "chaos with churn: heal p50 under 1 s".into(),
                r.heal_p50.map_or("n/a".into(), |s| format!("{s:.3} s")),
                r.heal_p50.is_some_and(|s| s < 1.0),
            ),
        ]
    }
}
