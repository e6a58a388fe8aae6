//! Chaos runs: faults injected at random into one deployment's ready
//! sandbox containers (killed, stopped, removed, OOM-killed), the time each
//! takes to heal, and the invariants checked once the fleet has settled:
//! exactly one container per desired engine, none without a desired row,
//! every `ready` status's credentials log in, and no container of another
//! deployment touched. `sandboxd chaos` runs it against a deployment;
//! `tests/integration/chaos.rs` adds controller kills, state database faults and row
//! churn around it.

use crate::adapters::chaos::{Fault, Injector};
use crate::adapters::{DockerRuntime, PgStore};
use crate::domain::container::ObservedContainer;
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::network::{container_name_prefix, container_selector};
use crate::domain::sandbox::Phase;
use crate::engine::{self, Credentials, Exec, Target};
use crate::ports::runtime::{Containers, RuntimeError};
use crate::ports::store::{Store, StoreError};
use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Failures of a chaos run (not what it found: that is the [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// Docker failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The state database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run was asked for too much.
    #[error("{0}")]
    Bounds(String),
}

/// Most faults one run injects.
pub const MAX_FAULTS: usize = 1000;
/// Longest run.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// How long one fault may take to heal before it counts as unhealed.
const HEAL_TIMEOUT: Duration = Duration::from_secs(120);

/// What to inject.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The deployment whose containers are hit (no other is touched).
    pub deployment: Deployment,
    /// How many faults.
    pub faults: usize,
    /// Spread over this long.
    pub duration: Duration,
    /// Which faults, picked at random.
    pub kinds: Vec<Fault>,
    /// Seed of the random choices (the same seed picks the same faults
    /// for the same fleet).
    pub seed: u64,
    /// How long, after the last fault, the fleet may take to settle.
    pub settle: Duration,
}

impl ChaosOptions {
    /// Refuses runs beyond [`MAX_FAULTS`] and [`MAX_DURATION`].
    pub fn check(&self) -> Result<(), ChaosError> {
        if self.faults == 0 || self.faults > MAX_FAULTS {
            return Err(ChaosError::Bounds(format!(
                "--faults must be between 1 and {MAX_FAULTS}"
            )));
        }
        if self.duration > MAX_DURATION || self.settle > MAX_DURATION {
            return Err(ChaosError::Bounds(format!(
                "--duration and --settle must be at most {MAX_DURATION:?}"
            )));
        }
        if self.kinds.is_empty() {
            return Err(ChaosError::Bounds("--kinds names no fault".into()));
        }
        Ok(())
    }
}

/// One injected fault and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// What was done.
    pub fault: &'static str,
    /// To which sandbox.
    pub sandbox: String,
    /// And engine.
    pub engine: String,
    /// Seconds from the fault until the engine was ready again with the
    /// same credentials; `None` if it was not within two minutes (or its
    /// sandbox was released meanwhile, see `released`).
    pub healed_after: Option<f64>,
    /// The sandbox's row was gone by the time it would have healed.
    pub released: bool,
    /// The engine survived the fault: its container still ran, with the
    /// same credentials, 5 s later (an OOM kill that hit another process).
    pub survived: bool,
    /// When it was injected.
    pub injected_at: chrono::DateTime<chrono::Utc>,
    /// Why the fault could not be injected, if it could not.
    pub error: Option<String>,
}

/// What a run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Every fault.
    pub records: Vec<FaultRecord>,
    /// Heal time percentiles, seconds.
    pub heal_p50: Option<f64>,
    /// 95th percentile.
    pub heal_p95: Option<f64>,
    /// Slowest heal.
    pub heal_max: Option<f64>,
    /// Faults whose engine did not come back (its row still desired).
    pub unhealed: usize,
    /// Containers left without a desired row after the fleet settled.
    pub leaked: Vec<String>,
    /// Engines with more than one container.
    pub duplicate: Vec<String>,
    /// Ready engines whose published credentials do not log in.
    pub lost_credentials: Vec<String>,
    /// Desired sandboxes not ready after the settle time.
    pub unconverged: Vec<String>,
    /// Containers of other deployments found changed (removed, replaced or
    /// no longer in the same state) after the run. Chaos never acts on
    /// them, but anything else on the host may have: information, not a
    /// failed invariant.
    pub others_touched: Vec<String>,
}

impl Report {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.unhealed == 0
            && self.leaked.is_empty()
            && self.duplicate.is_empty()
            && self.lost_credentials.is_empty()
            && self.unconverged.is_empty()
    }

    fn summarise(&mut self) {
        let mut heals: Vec<f64> = self.records.iter().filter_map(|r| r.healed_after).collect();
        heals.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            (!heals.is_empty()).then(|| heals[((heals.len() - 1) as f64 * q).round() as usize])
        };
        self.heal_p50 = pick(0.5);
        self.heal_p95 = pick(0.95);
        self.heal_max = heals.last().copied();
        self.unhealed = self
            .records
            .iter()
            .filter(|r| r.error.is_none() && r.healed_after.is_none() && !r.released && !r.survived)
            .count();
        self.faults = self.records.iter().fold(BTreeMap::new(), |mut m, r| {
            *m.entry(r.fault.to_owned()).or_default() += 1;
            m
        });
    }
}

/// Exec is not needed to check a login from the host.
struct NoExec;

#[async_trait]
impl Exec for NoExec {
    async fn exec(
        &self,
        _cmd: &[&str],
        _env: Vec<String>,
    ) -> Result<crate::domain::container::ExecOutput, String> {
        Err("not available to the chaos checker".into())
    }
}

/// A chaos run against one deployment.
pub struct Chaos {
    docker: DockerRuntime,
    injector: Injector,
    store: Arc<PgStore>,
    options: ChaosOptions,
}

impl Chaos {
    /// A run over `docker` and the state database `store`.
    pub fn new(
        docker: DockerRuntime,
        store: Arc<PgStore>,
        options: ChaosOptions,
    ) -> Result<Self, ChaosError> {
        options.check()?;
        Ok(Self {
            injector: Injector::new(docker.clone()),
            docker,
            store,
            options,
        })
    }

    /// Containers of other deployments, to compare after the run.
    pub async fn others(&self) -> Result<BTreeMap<String, (String, String)>, ChaosError> {
        Ok(self
            .injector
            .others(self.options.deployment.as_str())
            .await?)
    }

    /// Injects the faults, spread over the run's duration, and waits for
    /// each to heal (or time out).
    pub async fn inject(&self) -> Vec<FaultRecord> {
        let mut rng = StdRng::seed_from_u64(self.options.seed);
        let every = self.options.duration / self.options.faults as u32;
        let mut watchers = Vec::new();
        for _ in 0..self.options.faults {
            let fault = self.options.kinds[rng.random_range(0..self.options.kinds.len())];
            let pick: u64 = rng.random();
            match self.inject_one(fault, pick, None).await {
                Ok(Some((record, watch))) => watchers.push(tokio::spawn(watch.run(record))),
                Ok(None) => tracing::info!("chaos: no ready container to hit; skipping one fault"),
                Err(e) => tracing::warn!(error = %e, "chaos: could not look at the fleet"),
            }
            tokio::time::sleep(every).await;
        }
        let mut records = Vec::new();
        for w in watchers {
            if let Ok(r) = w.await {
                records.push(r);
            }
        }
        records
    }

    /// Injects `fault` into a ready engine of `sandbox` (the one `pick`
    /// chooses if several are ready) and waits until it is healed or
    /// [`HEAL_TIMEOUT`] has passed: for a run that hits the same sandbox
    /// again and again, each fault after the previous heal. `None` if the
    /// sandbox has no ready engine to hit now.
    pub async fn hit(
        &self,
        fault: Fault,
        sandbox: &SandboxId,
        pick: u64,
    ) -> Result<Option<FaultRecord>, ChaosError> {
        Ok(match self.inject_one(fault, pick, Some(sandbox)).await? {
            Some((record, watch)) => Some(watch.run(record).await),
            None => None,
        })
    }

    /// Injects `fault` into a ready engine, of `only` if given, of any
    /// sandbox otherwise.
    async fn inject_one(
        &self,
        fault: Fault,
        pick: u64,
        only: Option<&SandboxId>,
    ) -> Result<Option<(FaultRecord, HealWatch)>, ChaosError> {
        let statuses = self.store.list_status().await?;
        // The published container of each engine of a ready sandbox, found
        // as an operator finds a sandbox's containers: by the one selector
        // (`container_selector`, Docker's name filter), which finds the
        // warm-pool containers claimed for it too (they keep the pool's
        // labels). The engine's own name is the published container's
        // (a rotation's candidate has a name of its own until it is).
        let deployment = &self.options.deployment;
        let mut targets = Vec::new();
        for s in statuses
            .iter()
            .filter(|s| s.phase == Phase::Ready && only.is_none_or(|o| *o == s.id))
        {
            let named = self
                .injector
                .named(&container_selector(deployment, &s.id))
                .await?;
            let prefix = container_name_prefix(deployment, &s.id);
            for (engine_name, service) in &s.services {
                let published = format!("{prefix}{engine_name}");
                if let Some(c) = named.iter().find(|c| c.running && c.name == published) {
                    targets.push((
                        s.id.clone(),
                        engine_name.clone(),
                        c.name.clone(),
                        c.id.clone(),
                        service.heals,
                    ));
                }
            }
        }
        if targets.is_empty() {
            return Ok(None);
        }
        let (sandbox, engine_name, name, id, heals_before) =
            targets.swap_remove((pick % targets.len() as u64) as usize);
        let data_path = engine::lookup(&engine_name).map_or("/tmp", |e| e.data_path());
        let injected = Instant::now();
        let error = self
            .injector
            .inject(fault, &name, data_path)
            .await
            .err()
            .map(|e| e.to_string());
        tracing::info!(fault = fault.as_str(), sandbox = %sandbox, engine = %engine_name, error = ?error, "chaos: fault injected");
        let record = FaultRecord {
            fault: fault.as_str(),
            sandbox: sandbox.to_string(),
            engine: engine_name.clone(),
            healed_after: None,
            released: false,
            survived: false,
            injected_at: chrono::Utc::now(),
            error,
        };
        let watch = HealWatch {
            docker: self.docker.clone(),
            container: id,
            store: self.store.clone(),
            sandbox,
            engine: engine_name,
            heals_before,
            injected,
        };
        Ok(Some((record, watch)))
    }

    /// Waits for the fleet to settle (every desired sandbox ready, no
    /// container without a row), then checks the invariants.
    pub async fn check(
        &self,
        records: Vec<FaultRecord>,
        others_before: &BTreeMap<String, (String, String)>,
    ) -> Result<Report, ChaosError> {
        let deadline = Instant::now() + self.options.settle;
        let mut report;
        loop {
            report = self.look().await?;
            if (report.unconverged.is_empty()
                && report.leaked.is_empty()
                && report.duplicate.is_empty())
                || Instant::now() > deadline
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        report.lost_credentials = self.logins().await?;
        let others_after = self.others().await?;
        report.others_touched = others_before
            .iter()
            .filter(|(name, before)| others_after.get(*name) != Some(before))
            .map(|(name, _)| name.clone())
            .collect();
        report.records = records;
        report.summarise();
        Ok(report)
    }

    /// The deployment's sandbox containers, claimed warm-pool containers
    /// included (their claims, in the state database, say whose they are).
    async fn containers(&self) -> Result<Vec<ObservedContainer>, ChaosError> {
        let mut containers = self.docker.list(&self.options.deployment, None).await?;
        let claims = self.store.pool_claims().await?;
        if !claims.is_empty() {
            let pooled = self
                .docker
                .pool_containers(&self.options.deployment)
                .await?;
            containers.extend(crate::domain::pool::claimed(&claims, &pooled).0);
        }
        Ok(containers)
    }

    /// The fleet's shape now: unconverged rows, leaked and duplicate containers.
    async fn look(&self) -> Result<Report, ChaosError> {
        let desired: BTreeSet<String> = self.store.desired_ids().await?.into_iter().collect();
        let containers = self.containers().await?;
        let statuses = self.store.list_status().await?;
        let mut report = Report::default();
        let mut per_engine: BTreeMap<(String, String), usize> = BTreeMap::new();
        for c in &containers {
            if !desired.contains(c.labels.sandbox.as_str()) {
                report.leaked.push(c.name.clone());
            }
            *per_engine
                .entry((c.labels.sandbox.to_string(), c.labels.engine.clone()))
                .or_default() += 1;
        }
        report.duplicate = per_engine
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|((s, e), n)| format!("{s}/{e}: {n} containers"))
            .collect();
        for id in &desired {
            let Ok(sid) = SandboxId::parse(id) else {
                continue;
            };
            let Some(row) = self.store.fetch_desired(&sid).await? else {
                continue;
            };
            if row.expires_at.is_some_and(|t| t <= chrono::Utc::now()) {
                continue;
            }
            let ready = statuses.iter().any(|s| {
                s.id == sid && s.phase == Phase::Ready && s.observed_generation >= row.generation
            });
            if !ready {
                report.unconverged.push(id.clone());
            }
        }
        Ok(report)
    }

    /// Ready engines whose published credentials fail to log in.
    async fn logins(&self) -> Result<Vec<String>, ChaosError> {
        let mut lost = Vec::new();
        for s in self.store.list_status().await? {
            if s.phase != Phase::Ready {
                continue;
            }
            for (name, service) in &s.services {
                let Some(engine) = engine::lookup(name) else {
                    continue;
                };
                let credentials = Credentials {
                    user: service.user.clone(),
                    password: service.password.clone(),
                    database: service.database.clone(),
                };
                let target = Target {
                    host: "127.0.0.1",
                    port: service.host_port,
                    credentials: &credentials,
                    exec: &NoExec,
                };
                let ok = matches!(
                    tokio::time::timeout(Duration::from_secs(10), engine.probe(&target)).await,
                    Ok(Ok(()))
                );
                if !ok {
                    lost.push(format!("{}/{name}", s.id));
                }
            }
        }
        Ok(lost)
    }
}

/// Waits for one faulted engine to be ready again with one more heal.
struct HealWatch {
    docker: DockerRuntime,
    container: crate::domain::id::ContainerId,
    store: Arc<PgStore>,
    sandbox: SandboxId,
    engine: String,
    heals_before: u32,
    injected: Instant,
}

impl HealWatch {
    async fn run(self, mut record: FaultRecord) -> FaultRecord {
        if record.error.is_some() {
            return record;
        }
        while self.injected.elapsed() < HEAL_TIMEOUT {
            match self.store.fetch_status(&self.sandbox).await {
                Ok(None) => {
                    record.released = true;
                    return record;
                }
                Ok(Some(s)) => {
                    let healed = s.phase == Phase::Ready
                        && s.services
                            .get(&self.engine)
                            .is_some_and(|e| e.heals > self.heals_before);
                    if healed {
                        record.healed_after = Some(self.injected.elapsed().as_secs_f64());
                        return record;
                    }
                    if s.phase == Phase::Terminating {
                        record.released = true;
                        return record;
                    }
                    if s.phase == Phase::Ready && self.injected.elapsed() > Duration::from_secs(5) {
                        if let Ok(Some(run)) = self.docker.inspect(&self.container).await {
                            if run.running {
                                record.survived = true;
                                return record;
                            }
                        }
                    }
                }
                Err(_) => {}
            }
            if let Ok(None) = self.store.fetch_desired(&self.sandbox).await {
                record.released = true;
                return record;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        record
    }
}
