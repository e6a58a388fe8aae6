//! Controller configuration, independent of how it was parsed (see `cli`).

use crate::domain::breaker::{BreakerError, BreakerPolicy};
use crate::domain::crash_loop::CrashLoopPolicy;
use crate::domain::id::{Deployment, EngineName};
use crate::domain::isolation::Isolation;
use crate::domain::lease::{LeaseError, LeasePolicy};
use crate::domain::limits::Limits;
use crate::domain::network::SubnetPool;
use crate::domain::pool::PoolKey;
use crate::engine::{self, Engine, Registry, REGISTRY};
use crate::ports::runtime::{Disk, DiskStore};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

mod webhook;
mod webhook_trust;
pub use self::webhook::{WebhookConfig, WebhookConfigError, WebhookUrl};
pub use self::webhook_trust::{WebhookTrust, WebhookTrustError};

/// Invalid configuration values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// An `ENGINE=IMAGE` pair was malformed or named an unknown engine.
    #[error("invalid image override {0:?}: use ENGINE=IMAGE with ENGINE one of {engines}", engines = engine_names())]
    ImageOverride(String),
    /// The subnet pool or prefix is unusable.
    #[error(transparent)]
    Subnet(#[from] crate::domain::network::SubnetError),
    /// The environment variable prefix is not a valid variable name part.
    #[error("invalid env prefix {0:?}: use A-Z, 0-9 and '_', starting with a letter")]
    EnvPrefix(String),
    /// An `ENGINE=DURATION` readiness deadline named an unknown engine.
    #[error("invalid readiness timeout for {0:?}: use ENGINE=DURATION with ENGINE one of {engines}", engines = engine_names())]
    ReadinessOverride(String),
    /// The lease duration is unusable.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The reap breaker's share is unusable.
    #[error(transparent)]
    Breaker(#[from] BreakerError),
    /// A `--warm-pool` entry is malformed.
    #[error("invalid --warm-pool {0:?}: use ENGINE=SIZE or ENGINE:FEATURE,FEATURE=SIZE (e.g. postgres=2, postgres:vector,pg_trgm=1) with SIZE 0 to 32 and ENGINE one of {engines}", engines = pool_engine_names())]
    WarmPool(String),
    /// A `--warm-pool` entry names features its engine does not offer.
    #[error("invalid --warm-pool {entry:?}: {engine} offers the features {allowed:?} only")]
    WarmPoolFeatures {
        /// The entry.
        entry: String,
        /// The engine.
        engine: EngineName,
        /// What the engine offers.
        allowed: Vec<String>,
    },
    /// Two `--warm-pool` entries name one pool.
    #[error("--warm-pool names the pool {0} twice: give each engine and feature set one size")]
    WarmPoolTwice(String),
    /// The Swarm backend was asked for something it cannot do.
    #[error("--backend swarm: {0}")]
    Swarm(&'static str),
    /// A reconcile would be abandoned before an engine could become ready.
    #[error("--reconcile-timeout {reconcile:?} does not cover {engine}'s readiness timeout ({readiness:?}) plus --docker-timeout ({docker:?}): every reconcile that waits for {engine} could be abandoned; raise --reconcile-timeout")]
    ReconcileTimeout {
        /// The reconcile deadline.
        reconcile: Duration,
        /// The engine with the longest readiness deadline.
        engine: EngineName,
        /// Its readiness deadline.
        readiness: Duration,
        /// The deadline of one Docker call.
        docker: Duration,
    },
    /// The webhook's flags are unusable.
    #[error(transparent)]
    Webhook(#[from] WebhookConfigError),
}

/// Readiness deadlines by engine name, checked against the registry.
pub fn readiness_overrides(
    pairs: &[(String, Duration)],
) -> Result<BTreeMap<EngineName, Duration>, ConfigError> {
    pairs
        .iter()
        .map(|(name, d)| match engine::lookup(name) {
            Some(e) if !d.is_zero() => Ok((e.name(), *d)),
            _ => Err(ConfigError::ReadinessOverride(name.clone())),
        })
        .collect()
}

fn pool_engine_names() -> String {
    REGISTRY
        .iter()
        .filter(|e| e.has_pool())
        .map(|e| e.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Warm pools learned from demand (see [`ControllerConfig::warm_pool_demand`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolDemand {
    /// The most containers all learned pools hold together (0: off).
    pub max: usize,
    /// How long a request counts as demand for its feature set.
    pub window: Duration,
}

impl PoolDemand {
    /// No learned pools.
    pub const fn off() -> Self {
        Self {
            max: 0,
            window: Duration::from_secs(600),
        }
    }

    /// Whether pools are learned at all.
    pub fn is_on(&self) -> bool {
        self.max > 0
    }
}

/// The warm pools from `--warm-pool ENGINE[:FEATURE,FEATURE]=SIZE` entries
/// (features are comma-separated, so entries are not): each engine and
/// feature set at most once, engines that have a pool only; size 0 is off.
pub fn warm_pools(entries: &[String]) -> Result<BTreeMap<PoolKey, usize>, ConfigError> {
    let mut pools = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let bad = || ConfigError::WarmPool(entry.to_owned());
        let (pool, size) = entry.rsplit_once('=').ok_or_else(bad)?;
        let size: usize = size.trim().parse().map_err(|_| bad())?;
        if size > 32 {
            return Err(bad());
        }
        let (name, features) = match pool.split_once(':') {
            Some((name, features)) => (name, features),
            None => (pool, ""),
        };
        let engine = engine::lookup(name.trim()).ok_or_else(bad)?;
        if !engine.has_pool() {
            return Err(bad());
        }
        let features: BTreeSet<String> = features
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(String::from)
            .collect();
        let allowed = engine.allowed_features();
        if features.iter().any(|f| !allowed.contains(&f.as_str())) {
            return Err(ConfigError::WarmPoolFeatures {
                entry: entry.to_owned(),
                engine: engine.name(),
                allowed: allowed.iter().map(|f| f.to_string()).collect(),
            });
        }
        let key = PoolKey {
            engine: engine.name(),
            features,
            seed: None,
        };
        if pools.contains_key(&key) {
            return Err(ConfigError::WarmPoolTwice(key.to_string()));
        }
        pools.insert(key, size);
    }
    pools.retain(|_, size| *size > 0);
    Ok(pools)
}

fn engine_names() -> String {
    REGISTRY.names()
}

/// Which image each engine runs, without and with features.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Images {
    plain: BTreeMap<String, String>,
    with_features: BTreeMap<String, String>,
}

fn parse_overrides(pairs: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    pairs
        .iter()
        .flat_map(|p| p.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((e, img)) if engine::lookup(e).is_some() && !img.is_empty() => {
                Ok((e.to_owned(), img.to_owned()))
            }
            _ => Err(ConfigError::ImageOverride(p.to_owned())),
        })
        .collect()
}

impl Images {
    /// Upstream defaults overridden by `ENGINE=IMAGE` pairs (comma-separated
    /// lists are accepted too). The features image defaults to the plain
    /// override when only that is given.
    pub fn new(plain: &[String], with_features: &[String]) -> Result<Self, ConfigError> {
        let plain = parse_overrides(plain)?;
        let with_features = parse_overrides(with_features)?;
        Ok(Self {
            plain,
            with_features,
        })
    }

    /// The image to run for `engine`.
    pub fn image_for(&self, engine: &dyn Engine, has_features: bool) -> String {
        let plain = self.plain.get(engine.name().as_str());
        if has_features {
            if let Some(img) = self.with_features.get(engine.name().as_str()) {
                return img.clone();
            }
            if let Some(img) = plain {
                if engine.default_features_image() == engine.default_image() {
                    return img.clone();
                }
            }
            return engine.default_features_image().to_owned();
        }
        plain
            .cloned()
            .unwrap_or_else(|| engine.default_image().to_owned())
    }
}

/// How the controller reaches sandbox containers for readiness checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeVia {
    /// 127.0.0.1 and the published port (sandboxd runs on the Docker host).
    Host,
    /// Container name and engine port (sandboxd runs on the sandbox network).
    Network,
}

/// Where sandbox engines run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Containers on the one Docker engine sandboxd talks to.
    #[default]
    Docker,
    /// One-replica services on the Docker Swarm whose manager sandboxd
    /// talks to (see docs/swarm.md).
    Swarm,
}

/// The image of the Swarm backend's helper (`--swarm-helper-image`) by
/// default: the image `scripts/run.sh` builds and runs sandboxd from
/// under Swarm.
pub const DEFAULT_SWARM_HELPER_IMAGE: &str = "sandboxd/controller:local";

/// Whether a Swarm service publishes its engine port on the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SwarmPublish {
    /// Nothing published: engines answer on their sandbox's overlay only.
    #[default]
    None,
    /// The engine port on the node that runs the task, on every address
    /// of that node (Swarm's host mode has no bind address): reachable by
    /// whatever reaches the node. WEAKER; firewall the nodes.
    Host,
}

/// How sandbox containers are networked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkLayout {
    /// Each sandbox gets its own bridge network (`sandboxd.DEPLOYMENT.ID`)
    /// with a subnet from `subnets`; its engines answer there by their
    /// engine name and nowhere else. Without `egress`, IP masquerading is
    /// off: nothing beyond the host is reachable.
    PerSandbox {
        /// Where the networks' subnets come from.
        subnets: SubnetPool,
        /// Whether sandboxes may reach beyond the host (weaker).
        egress: bool,
    },
    /// Every sandbox of the deployment on one network with egress
    /// (weaker: a sandbox reaches the others' engines by name).
    Shared {
        /// The network's name.
        name: String,
    },
}

/// Everything the controller needs to know.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Label scope: containers of other deployments are invisible.
    pub deployment: Deployment,
    /// Where sandbox engines run.
    pub backend: Backend,
    /// Under the Swarm backend, whether engine ports are published.
    pub swarm_publish: SwarmPublish,
    /// Under the Swarm backend, the image of the helper that runs commands
    /// inside engines on other nodes (sandboxd's own; on every node).
    pub swarm_helper_image: String,
    /// How sandboxes are networked.
    pub network: NetworkLayout,
    /// sandboxd's own container, when it runs in one and probes sandboxes
    /// by name ([`ProbeVia::Network`]): connected to every sandbox network.
    pub controller_container: Option<String>,
    /// Prefix of emitted environment variables.
    pub env_prefix: String,
    /// Engine images.
    pub images: Images,
    /// Resource caps per container.
    pub limits: Limits,
    /// Containers younger than this are not reaped, nor those of a row this
    /// controller saw deleted more recently.
    pub grace: Duration,
    /// How often both sides are listed in full.
    pub relist_interval: Duration,
    /// How often a relist reconciles every sandbox, even those its lists
    /// show converged (what they cannot show: a stranger on a sandbox's
    /// network, an attached container gone).
    pub resync_interval: Duration,
    /// Most reconciles running at once.
    pub concurrency: usize,
    /// Bound on pulling an absent image.
    pub pull_timeout: Duration,
    /// Bound on every other Docker call (a removal gets `stop_timeout` on top).
    pub docker_timeout: Duration,
    /// How long relists must have found a `sbx…` bridge without its Docker
    /// network before it is removed.
    pub stale_bridge_age: Duration,
    /// Bound on every state database call.
    pub store_timeout: Duration,
    /// Bound on one whole reconcile: past it the reconcile is abandoned
    /// and retried with backoff, and its worker slot is freed.
    pub reconcile_timeout: Duration,
    /// SIGTERM-to-SIGKILL time when tearing a container down.
    pub stop_timeout: Duration,
    /// How readiness checks reach containers.
    pub probe_via: ProbeVia,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_addr: SocketAddr,
    /// How long a graceful shutdown waits for in-flight reconciles.
    pub shutdown_grace: Duration,
    /// Run (via `sh -c`, the image as `$1`) when an image is absent and
    /// cannot be pulled; sandboxd then uses the image if it exists.
    pub image_build_command: Option<String>,
    /// Bound on the build command.
    pub build_timeout: Duration,
    /// Size cap of each persistent sandbox's data volume, in bytes,
    /// enforced by the file system (`domain::volume_disk`); 0: uncapped
    /// (WEAKER: a persistent sandbox can fill the host's disk).
    pub persistent_size: u64,
    /// Where capped volumes' files live on the Docker host, and the image
    /// of the job that makes and attaches them.
    pub disks: DiskStore,
    /// Whether non-persistent sandboxes start from pre-initialised
    /// templates (see `controller::template`).
    pub templates: bool,
    /// How many seeds may be loaded (or a seed's data file written) at
    /// once; more wait their turn (see `controller::seed`).
    pub seed_loads: u16,
    /// Bound on one template job.
    pub template_timeout: Duration,
    /// Idle timeout of rows that set none (`None`: sandboxes never go idle
    /// unless their row says so).
    pub idle_timeout: Option<Duration>,
    /// Readiness deadlines that replace an engine's own
    /// ([`crate::engine::Engine::readiness_deadline`]).
    pub readiness: BTreeMap<EngineName, Duration>,
    /// How heals of an engine whose container keeps dying back off, and
    /// when they stop (a crash loop).
    pub crash_loop: CrashLoopPolicy,
    /// The leader lease's timings.
    pub lease: LeasePolicy,
    /// This process's name in the lease row (unique per process).
    pub holder: String,
    /// When the reaping circuit breaker trips.
    pub breaker: BreakerPolicy,
    /// Warm pools: ready, unclaimed containers kept per engine and
    /// feature set (empty: off).
    pub warm_pool: BTreeMap<PoolKey, usize>,
    /// Warm pools learned from demand: the feature sets requested within
    /// `window` each get a pool, sized from how often they were asked
    /// for, all of them together holding at most `max` containers (0: off).
    pub warm_pool_demand: PoolDemand,
    /// How many events each sandbox keeps in `sandbox_events` per owner (its
    /// newest).
    pub events_per_sandbox: u32,
    /// Events that last happened longer ago than this are deleted (at
    /// relists).
    pub event_retention: Duration,
    /// Seeds no desired row has named for this long are deleted (at
    /// relists).
    pub seed_retention: Duration,
    /// Where each recorded event is also POSTed, signed (`None`: nowhere).
    pub webhook: Option<WebhookConfig>,
    /// Host memory kept out of the admission budget for the controller,
    /// its state database and dockerd (the budget is the host's memory
    /// minus this, unless `memory_budget` is set).
    pub memory_reserve: u64,
    /// The admission budget for sandbox memory (the sum of the engines'
    /// caps and the warm pools'), replacing the one derived from the host;
    /// `None`: derived from the host.
    pub memory_budget: Option<u64>,
    /// The least isolation level of every sandbox (`--runtime`): its
    /// containers, the warm pools' included, run under this level's OCI
    /// runtime unless their row asks for a stronger one.
    pub isolation: Isolation,
}

/// Host memory kept out of the admission budget unless `--memory-reserve`
/// says otherwise.
pub const DEFAULT_MEMORY_RESERVE: u64 = 2 << 30;

/// Default `--persistent-size`: 1 GiB per persistent volume.
pub const DEFAULT_PERSISTENT_SIZE: u64 = 1 << 30;

/// Default `--seed-loads`: seeds loaded at once. Each holds a few chunks
/// of its seed in this process (`controller::seed::CHUNK_BYTES`); the
/// engines do the work.
pub const DEFAULT_SEED_LOADS: u16 = 4;

/// Default `--persistent-disks-dir`, on the Docker host.
pub const DEFAULT_DISKS_DIR: &str = "/var/lib/sandboxd/disks";

/// The image of the job that makes, attaches and removes capped volumes'
/// file systems (built by `deploy/images/build.sh` from `deploy/images/disk`).
pub const DISK_IMAGE: &str = "sandboxd/disk:1";

/// How many events a sandbox keeps unless `--events-per-sandbox` says
/// otherwise.
pub const DEFAULT_EVENTS_PER_SANDBOX: u32 = 50;

/// The most `--events-per-sandbox` may keep.
pub const MAX_EVENTS_PER_SANDBOX: u32 = 1000;

impl ControllerConfig {
    /// The size cap of a persistent sandbox's data volume, if any.
    pub fn persistent_disk(&self) -> Option<Disk> {
        (self.persistent_size > 0).then(|| Disk {
            store: self.disks.clone(),
            bytes: self.persistent_size,
        })
    }

    /// Defaults for `deployment`.
    pub fn new(deployment: Deployment) -> Self {
        Self {
            deployment,
            backend: Backend::Docker,
            swarm_publish: SwarmPublish::None,
            swarm_helper_image: DEFAULT_SWARM_HELPER_IMAGE.to_owned(),
            network: NetworkLayout::PerSandbox {
                subnets: SubnetPool::default(),
                egress: false,
            },
            controller_container: None,
            env_prefix: "SANDBOX".into(),
            images: Images::default(),
            limits: Limits::default(),
            grace: Duration::from_secs(180),
            relist_interval: Duration::from_secs(60),
            resync_interval: Duration::from_secs(600),
            concurrency: 8,
            // A cold pull on slow storage takes minutes (the Python
            // provisioner's agents were stranded by a 20 s limit).
            pull_timeout: Duration::from_secs(300),
            docker_timeout: Duration::from_secs(30),
            stale_bridge_age: crate::domain::host_net::STALE_BRIDGE_AGE,
            store_timeout: Duration::from_secs(10),
            // Three times the longest default readiness deadline (60 s):
            // room for the wait, the Docker calls around it and the
            // status writes.
            reconcile_timeout: Duration::from_secs(180),
            stop_timeout: Duration::from_secs(2),
            probe_via: ProbeVia::Host,
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 9187)),
            shutdown_grace: Duration::from_secs(30),
            image_build_command: None,
            build_timeout: Duration::from_secs(900),
            templates: true,
            seed_loads: DEFAULT_SEED_LOADS,
            template_timeout: Duration::from_secs(120),
            persistent_size: DEFAULT_PERSISTENT_SIZE,
            disks: DiskStore {
                dir: DEFAULT_DISKS_DIR.into(),
                image: DISK_IMAGE.into(),
            },
            idle_timeout: None,
            readiness: BTreeMap::new(),
            crash_loop: CrashLoopPolicy::default(),
            lease: LeasePolicy::default(),
            holder: default_holder(),
            breaker: BreakerPolicy::default(),
            warm_pool: BTreeMap::new(),
            warm_pool_demand: PoolDemand::off(),
            events_per_sandbox: DEFAULT_EVENTS_PER_SANDBOX,
            event_retention: Duration::from_secs(24 * 3600),
            seed_retention: Duration::from_secs(24 * 3600),
            webhook: None,
            memory_reserve: DEFAULT_MEMORY_RESERVE,
            memory_budget: None,
            isolation: Isolation::Container,
        }
    }

    /// How long `engine` may take to become ready.
    pub fn readiness_deadline(&self, engine: &dyn Engine) -> Duration {
        self.readiness
            .get(&engine.name())
            .copied()
            .unwrap_or_else(|| engine.readiness_deadline())
    }

    /// Refuses a reconcile deadline that does not cover the longest
    /// readiness deadline of `engines` plus one Docker call.
    pub fn check_reconcile_timeout(&self, engines: Registry) -> Result<(), ConfigError> {
        let Some(engine) = engines.iter().max_by_key(|e| self.readiness_deadline(*e)) else {
            return Ok(());
        };
        let readiness = self.readiness_deadline(engine);
        if self.reconcile_timeout > readiness.saturating_add(self.docker_timeout) {
            return Ok(());
        }
        Err(ConfigError::ReconcileTimeout {
            reconcile: self.reconcile_timeout,
            engine: engine.name(),
            readiness,
            docker: self.docker_timeout,
        })
    }

    /// Checks the configuration against the Swarm backend: refuses what it
    /// cannot do (another OCI runtime; probing at 127.0.0.1 when nothing
    /// is published). Templates and warm pools stay (templates are built
    /// on every node: see `adapters::swarm::template_job`).
    pub fn for_swarm(self) -> Result<Self, ConfigError> {
        if self.backend != Backend::Swarm {
            return Ok(self);
        }
        if self.isolation != Isolation::Container {
            return Err(ConfigError::Swarm(
                "a Swarm service cannot choose its OCI runtime, so --runtime runsc cannot hold: drop --runtime, or run the docker backend",
            ));
        }
        if self.probe_via == ProbeVia::Host && self.swarm_publish == SwarmPublish::None {
            return Err(ConfigError::Swarm(
                "--probe-via host reaches engines at 127.0.0.1 on the port their task publishes, and nothing is published: pass --swarm-publish host (sandboxd then reaches each task at its node's address), or run sandboxd in a container with --probe-via network --controller-container NAME",
            ));
        }
        Ok(self)
    }
}

/// A name for this process in the lease row: host, process id and a
/// random part (two processes never share one, even across restarts).
pub fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "sandboxd".into());
    let random: u32 = rand::random();
    format!("{host}:{}:{random:08x}", std::process::id())
}

/// Validates an environment variable prefix such as `SANDBOX` or `ROBOCO_TEST`.
pub fn parse_env_prefix(s: &str) -> Result<String, ConfigError> {
    let ok = s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(ConfigError::EnvPrefix(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swarm() -> ControllerConfig {
        let mut c = ControllerConfig::new(Deployment::parse("d").unwrap());
        c.backend = Backend::Swarm;
        c.swarm_publish = SwarmPublish::Host;
        c
    }

    #[test]
    fn the_swarm_backend_keeps_templates() {
        let c = swarm().for_swarm().unwrap();
        assert!(c.templates);
        let docker = ControllerConfig::new(Deployment::parse("d").unwrap());
        assert!(docker.clone().for_swarm().unwrap().templates);
    }

    #[test]
    fn the_swarm_backend_keeps_warm_pools_and_refuses_host_probes_with_nothing_published() {
        let mut pooled = swarm();
        pooled.warm_pool = warm_pools(&["postgres=1".to_owned()]).unwrap();
        pooled.warm_pool_demand.max = 2;
        let kept = pooled.for_swarm().unwrap();
        assert_eq!(kept.warm_pool.values().sum::<usize>(), 1);
        assert!(kept.warm_pool_demand.is_on());
        let mut hidden = swarm();
        hidden.swarm_publish = SwarmPublish::None;
        let e = hidden.clone().for_swarm().unwrap_err().to_string();
        assert!(e.contains("--swarm-publish host"), "{e}");
        hidden.probe_via = ProbeVia::Network;
        assert!(hidden.clone().for_swarm().is_ok());
        hidden.isolation = Isolation::Gvisor;
        let e = hidden.for_swarm().unwrap_err().to_string();
        assert!(e.contains("--runtime runsc"), "{e}");
    }

    #[test]
    fn images_default_to_upstream_and_follow_overrides() {
        let pg = engine::lookup("postgres").unwrap();
        let redis = engine::lookup("redis").unwrap();
        let images = Images::default();
        assert_eq!(images.image_for(pg, false), "sandboxd/postgres:17");
        let images = Images::new(
            &["postgres=sandboxd/postgres:17,redis=sandboxd/redis:8".into()],
            &["postgres=sandboxd/postgres-ext:17".into()],
        )
        .unwrap();
        assert_eq!(images.image_for(pg, false), "sandboxd/postgres:17");
        assert_eq!(images.image_for(pg, true), "sandboxd/postgres-ext:17");
        assert_eq!(images.image_for(redis, true), "sandboxd/redis:8");
    }

    #[test]
    fn unknown_engines_in_image_overrides_are_refused() {
        let err = Images::new(&["no-such-engine=x:1".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("postgres, redis, mongo"));
        assert!(Images::new(&["postgres".into()], &[]).is_err());
    }

    #[test]
    fn warm_pools_name_an_engine_with_a_pool_its_features_and_a_size() {
        let pools = warm_pools(&[
            "postgres=2".into(),
            "redis=1".into(),
            "postgres:vector,pg_trgm=1".into(),
        ])
        .unwrap();
        assert_eq!(pools.len(), 3);
        let key = PoolKey {
            engine: engine::lookup("postgres").unwrap().name(),
            features: BTreeSet::from(["pg_trgm".into(), "vector".into()]),
            seed: None,
        };
        assert_eq!(pools[&key], 1);
        assert!(warm_pools(&["redis=0".into()]).unwrap().is_empty());
        for bad in [
            "postgres",
            "postgres=x",
            "postgres=33",
            "nosuch=1",
            "mongo=1",
        ] {
            assert_eq!(
                warm_pools(&[bad.into()]),
                Err(ConfigError::WarmPool(bad.into())),
                "{bad}"
            );
        }
        assert!(matches!(
            warm_pools(&["postgres:nosuch=1".into()]),
            Err(ConfigError::WarmPoolFeatures { .. })
        ));
        assert!(matches!(
            warm_pools(&["redis=1".into(), "redis=2".into()]),
            Err(ConfigError::WarmPoolTwice(_))
        ));
    }

    #[test]
    fn env_prefixes_must_be_variable_names() {
        assert_eq!(parse_env_prefix("ROBOCO_TEST").unwrap(), "ROBOCO_TEST");
        assert!(parse_env_prefix("roboco").is_err());
        assert!(parse_env_prefix("1X").is_err());
        assert!(parse_env_prefix("A-B").is_err());
    }

    #[test]
    fn a_reconcile_timeout_must_cover_the_longest_readiness_wait_and_one_docker_call() {
        let mut c = ControllerConfig::new(Deployment::parse("d").unwrap());
        assert_eq!(
            c.check_reconcile_timeout(REGISTRY),
            Ok(()),
            "the defaults fit"
        );
        c.reconcile_timeout = Duration::from_secs(90);
        let err = c.check_reconcile_timeout(REGISTRY).unwrap_err();
        assert!(
            err.to_string().contains("raise --reconcile-timeout"),
            "{err}"
        );
        c.reconcile_timeout = Duration::from_secs(91);
        assert_eq!(c.check_reconcile_timeout(REGISTRY), Ok(()));
        c.readiness = readiness_overrides(&[("redis".into(), Duration::from_secs(120))]).unwrap();
        let err = c.check_reconcile_timeout(REGISTRY).unwrap_err();
        assert!(
            err.to_string().contains("redis's readiness timeout (120s)"),
            "{err}"
        );
    }

    #[test]
    fn readiness_overrides_name_known_engines_and_positive_durations() {
        let got = readiness_overrides(&[("redis".into(), Duration::from_secs(5))]).unwrap();
        assert_eq!(got[&EngineName::of_engine("redis")], Duration::from_secs(5));
        assert!(readiness_overrides(&[("nope".into(), Duration::from_secs(5))]).is_err());
        assert!(readiness_overrides(&[("redis".into(), Duration::ZERO)]).is_err());
        let c = ControllerConfig::new(Deployment::parse("d").unwrap());
        assert_eq!(
            c.readiness_deadline(&crate::engine::REDIS),
            Duration::from_secs(15)
        );
        assert_eq!(
            c.readiness_deadline(&crate::engine::Postgres),
            Duration::from_secs(60)
        );
    }
}
