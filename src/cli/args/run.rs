//! The flags of `sandboxd run`, and the controller configuration they
//! describe.

use super::parse::{parse_duration, parse_engine_duration, parse_holder, parse_size, parse_switch};
use crate::config::{
    parse_env_prefix, Backend, ControllerConfig, Images, NetworkLayout, ProbeVia, SwarmPublish,
};
use crate::domain::id::Deployment;
use crate::domain::isolation::Isolation;
use crate::domain::limits::Limits;
use crate::domain::network::{Ipv4Net, SubnetPool};
use clap::Args;
use std::net::SocketAddr;
use std::time::Duration;

/// `--network-layout` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkLayoutArg {
    /// One network per sandbox, no route out.
    PerSandbox,
    /// One network for every sandbox, with egress (weaker).
    Shared,
}

/// `--runtime` values: the OCI runtime every sandbox container runs under
/// at least.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeArg {
    /// Docker's default runtime (runc): isolation `container`.
    #[value(alias = "runc")]
    Default,
    /// gVisor, registered with dockerd as `runsc`: isolation `gvisor`.
    Runsc,
}

impl From<RuntimeArg> for Isolation {
    fn from(arg: RuntimeArg) -> Self {
        match arg {
            RuntimeArg::Default => Isolation::Container,
            RuntimeArg::Runsc => Isolation::Gvisor,
        }
    }
}

/// Flags of `sandboxd run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Deployment name: the label scope of this controller.
    #[arg(long, env = "SANDBOXD_DEPLOYMENT", default_value = "default")]
    pub deployment: Deployment,
    /// How sandboxes are networked: `per-sandbox` (each its own network, no
    /// route out) or `shared` (one network for all, with egress: WEAKER, a
    /// sandbox reaches the others' engines).
    #[arg(long, env = "SANDBOXD_NETWORK_LAYOUT", default_value = "per-sandbox")]
    pub network_layout: NetworkLayoutArg,
    /// The network of the `shared` layout (created if missing).
    #[arg(long, env = "SANDBOXD_NETWORK", default_value = "sandboxd")]
    pub network: String,
    /// Where sandbox engines run: `docker` (containers on this engine) or
    /// `swarm` (one-replica services on the Swarm this engine manages, on
    /// per-sandbox attachable overlays; templates built on every node, a
    /// claim only for a sandbox's first engine, persistent sandboxes held
    /// to the manager node; see docs/swarm.md).
    #[arg(long, env = "SANDBOXD_BACKEND", default_value = "docker")]
    pub backend: Backend,
    /// Under `--backend swarm`: `none` (engines answer on their overlay
    /// only) or `host` (each task publishes its engine port on its node's
    /// every address, as Swarm's host mode does: WEAKER, firewall the
    /// nodes; needed for --probe-via host).
    #[arg(long, env = "SANDBOXD_SWARM_PUBLISH", default_value = "none")]
    pub swarm_publish: SwarmPublish,
    /// Under `--backend swarm`: the image of the one-shot helper that runs
    /// a checkpoint's or reset's commands inside an engine on another node
    /// (sandboxd's own image, holding that node's Docker socket); it must
    /// be on every node, like the engine images.
    #[arg(
        long,
        env = "SANDBOXD_SWARM_HELPER_IMAGE",
        default_value = crate::config::DEFAULT_SWARM_HELPER_IMAGE
    )]
    pub swarm_helper_image: String,
    /// Address range per-sandbox networks take their subnets from.
    #[arg(long, env = "SANDBOXD_SUBNET_POOL", default_value = "10.213.0.0/16")]
    pub subnet_pool: Ipv4Net,
    /// Prefix length of each per-sandbox network (27: 29 addresses).
    #[arg(long, env = "SANDBOXD_SUBNET_PREFIX", default_value_t = 27)]
    pub subnet_prefix: u8,
    /// Let per-sandbox networks reach beyond the host through NAT (WEAKER:
    /// an agent can then send data anywhere).
    #[arg(long, env = "SANDBOXD_ALLOW_EGRESS")]
    pub allow_egress: bool,
    /// sandboxd's own container, when it runs in one with --probe-via
    /// network: it is connected to every sandbox network.
    #[arg(long, env = "SANDBOXD_CONTROLLER_CONTAINER")]
    pub controller_container: Option<String>,
    /// Added to each sandbox container's OOM score (1..1000), so the kernel
    /// kills sandboxes before sandboxd, its database or dockerd.
    #[arg(long, env = "SANDBOXD_OOM_SCORE_ADJ", default_value_t = 500, value_parser = clap::value_parser!(i64).range(0..=1000))]
    pub oom_score_adj: i64,
    /// Prefix of emitted environment variables (`<PREFIX>_DB_HOST`, ...).
    #[arg(long, env = "SANDBOXD_ENV_PREFIX", default_value = "SANDBOX", value_parser = parse_env_prefix)]
    pub env_prefix: String,
    /// Image per engine without features, ENGINE=IMAGE (repeatable or comma-separated).
    #[arg(long = "image", env = "SANDBOXD_IMAGES", value_delimiter = ',')]
    pub images: Vec<String>,
    /// Image per engine when features are requested, ENGINE=IMAGE.
    #[arg(
        long = "features-image",
        env = "SANDBOXD_FEATURES_IMAGES",
        value_delimiter = ','
    )]
    pub features_images: Vec<String>,
    /// Warm pool: ready, unclaimed containers kept per engine and feature
    /// set, ENGINE=SIZE or ENGINE:FEATURE,FEATURE=SIZE (repeatable; in the
    /// variable, separated by spaces or ';'). Off unless set.
    #[arg(long = "warm-pool", env = "SANDBOXD_WARM_POOL", value_delimiter = ';')]
    pub warm_pool: Vec<String>,
    /// Warm pools learned from demand: every engine and feature set
    /// requested within --warm-pool-demand-window gets a pool of its own,
    /// sized from how often it was asked for; together they hold at most
    /// this many containers, counted in the memory budget (0: off).
    #[arg(
        long = "warm-pool-demand",
        env = "SANDBOXD_WARM_POOL_DEMAND",
        default_value_t = 4
    )]
    pub warm_pool_demand: usize,
    /// How long a request counts as demand for its engine and feature set.
    #[arg(long = "warm-pool-demand-window", env = "SANDBOXD_WARM_POOL_DEMAND_WINDOW", default_value = "10m", value_parser = parse_duration)]
    pub warm_pool_demand_window: Duration,
    /// Containers younger than this are not reaped, nor those of a row this
    /// sandboxd saw deleted more recently (e.g. 180s, 3m).
    #[arg(long, env = "SANDBOXD_GRACE", default_value = "180s", value_parser = parse_duration)]
    pub grace: Duration,
    /// How often both sides are listed in full.
    #[arg(long, env = "SANDBOXD_RELIST_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub relist_interval: Duration,
    /// How often a relist reconciles every sandbox, not only those its
    /// lists show changed (a full resync).
    #[arg(long, env = "SANDBOXD_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// Most reconciles at once.
    #[arg(long, env = "SANDBOXD_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,
    /// Bound on pulling an absent image (a cold pull on slow storage takes minutes).
    #[arg(long, env = "SANDBOXD_PULL_TIMEOUT", default_value = "300s", value_parser = parse_duration)]
    pub pull_timeout: Duration,
    /// How long an engine may take to become ready, per engine (ENGINE=DURATION,
    /// repeatable or comma-separated); defaults: postgres 60s, redis and valkey 15s, mongo 60s.
    #[arg(long = "readiness-timeout", env = "SANDBOXD_READINESS_TIMEOUTS", value_delimiter = ',', value_parser = parse_engine_duration)]
    pub readiness_timeouts: Vec<(String, Duration)>,
    /// Release sandboxes whose row sets no idle timeout after this long
    /// without a request or touch (e.g. 2h); off unless set. A row's
    /// idle_timeout of 0 means never.
    #[arg(long, env = "SANDBOXD_IDLE_TIMEOUT", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Bound on every other Docker call (a removal gets --stop-timeout on top).
    #[arg(long, env = "SANDBOXD_DOCKER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub docker_timeout: Duration,
    /// Remove a Linux bridge named like sandboxd's (sbx…) once relists have
    /// found it without its Docker network for this long (Docker's own
    /// network removal leaves it behind for a moment; one left this long
    /// outlived its network, and its route hides its subnet).
    #[arg(long, env = "SANDBOXD_STALE_BRIDGE_AGE", default_value = "30s", value_parser = parse_duration)]
    pub stale_bridge_age: Duration,
    /// Bound on every state database call.
    #[arg(long, env = "SANDBOXD_STORE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub store_timeout: Duration,
    /// Bound on one whole reconcile (it must cover the longest readiness
    /// timeout plus --docker-timeout): past it the reconcile is abandoned
    /// and retried with backoff.
    #[arg(long, env = "SANDBOXD_RECONCILE_TIMEOUT", default_value = "180s", value_parser = parse_duration)]
    pub reconcile_timeout: Duration,
    /// SIGTERM-to-SIGKILL time when tearing a container down.
    #[arg(long, env = "SANDBOXD_STOP_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub stop_timeout: Duration,
    /// Memory cap per sandbox container, MiB.
    #[arg(long, env = "SANDBOXD_MEMORY_MB", default_value_t = 512)]
    pub memory_mb: i64,
    /// CPU cap per sandbox container, in CPUs.
    #[arg(long, env = "SANDBOXD_CPUS", default_value_t = 1.0)]
    pub cpus: f64,
    /// Process cap per sandbox container.
    #[arg(long, env = "SANDBOXD_PIDS", default_value_t = 256)]
    pub pids: i64,
    /// Size of the tmpfs data directory, MiB.
    #[arg(long, env = "SANDBOXD_TMPFS_MB", default_value_t = 512)]
    pub tmpfs_mb: i64,
    /// The OCI runtime every sandbox container runs under at least:
    /// `default` (Docker's, runc: the host's kernel answers the engines'
    /// system calls) or `runsc` (gVisor's user-space kernel does; dockerd
    /// must have it registered with runtimeArgs ["--network=host"]:
    /// scripts/run.sh does so with SANDBOXD_INSTALL_RUNSC=1). A row may
    /// ask for more (`isolation = 'gvisor'`), never for less.
    #[arg(long, env = "SANDBOXD_RUNTIME", default_value = "default")]
    pub runtime: RuntimeArg,
    /// How readiness checks reach containers.
    #[arg(long, env = "SANDBOXD_PROBE_VIA", default_value = "host")]
    pub probe_via: ProbeVia,
    /// Command run (`sh -c`, image as $1) when an image is absent and cannot
    /// be pulled (sandboxd's own `sandboxd/…` images are never pulled, only
    /// built), e.g. `deploy/images/build.sh`; the image is used if it then exists.
    #[arg(long, env = "SANDBOXD_IMAGE_BUILD_COMMAND")]
    pub image_build_command: Option<String>,
    /// Bound on the image build command.
    #[arg(long, env = "SANDBOXD_BUILD_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub build_timeout: Duration,
    /// Size cap of each persistent sandbox's data volume (an ext4 file
    /// system in a sparse file on the Docker host: the engine gets "no space
    /// left on device" when it is full); 0 for none (WEAKER: a persistent
    /// sandbox can fill the host's disk). A volume keeps the size it was made with.
    #[arg(long, env = "SANDBOXD_PERSISTENT_SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub persistent_size: u64,
    /// Directory on the Docker host holding the capped volumes' files (one
    /// `NAME.KEY.img` per persistent volume, KEY random per Docker volume).
    #[arg(long, env = "SANDBOXD_PERSISTENT_DISKS_DIR", default_value = crate::config::DEFAULT_DISKS_DIR)]
    pub persistent_disks_dir: String,
    /// Start non-persistent sandboxes from pre-initialised templates
    /// (built once per engine image and feature set, in the background):
    /// `on` or `off`.
    #[arg(long, env = "SANDBOXD_TEMPLATES", default_value = "on", value_parser = parse_switch)]
    pub templates: bool,
    /// How many seeds are loaded into engines at once (or seed data files
    /// written); more wait their turn, each at most as long as a load may
    /// take. A load streams its seed in chunks, so this bounds what seeds
    /// cost sandboxd's memory (a few hundred KiB each).
    #[arg(long, env = "SANDBOXD_SEED_LOADS", default_value_t = crate::config::DEFAULT_SEED_LOADS, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub seed_loads: u16,
    /// Bound on one template job (initialising a template's data directory).
    #[arg(long, env = "SANDBOXD_TEMPLATE_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub template_timeout: Duration,
    /// How long SIGTERM waits for in-flight reconciles before exiting.
    #[arg(long, env = "SANDBOXD_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "SANDBOXD_METRICS_ADDR", default_value = "127.0.0.1:9187")]
    pub metrics_addr: SocketAddr,
    /// A name clients reach the --metrics-addr port by, besides IP
    /// addresses and localhost (repeatable; comma-separated in the
    /// variable), e.g. a Prometheus scrape target's or a proxy's. Every
    /// route of the port (the operator page, /metrics, /healthz, /readyz)
    /// answers 403 to a request whose Host is none of them, so that no
    /// DNS-rebinding page can read it.
    #[arg(long = "http-host", env = "SANDBOXD_HTTP_HOSTS", value_delimiter = ',')]
    pub http_hosts: Vec<String>,
    /// Serve the operator page (`/`: the leader, the warm pools, every
    /// sandbox with its owner; `/sandboxes/ID`: what `describe` shows,
    /// never a password) on the --metrics-addr port: `on` or `off`. It
    /// shows every owner's sandboxes to whoever reaches that port.
    #[arg(long, env = "SANDBOXD_OPERATOR_PAGE", default_value = "on", value_parser = parse_switch)]
    pub operator_page: bool,
    /// File holding the token (16 characters or more, the file readable
    /// by its owner only) that the operator page's actions need: release,
    /// resume, resume-reaping. Without it the page is read-only.
    #[arg(long, env = "SANDBOXD_OPERATOR_TOKEN_FILE")]
    pub operator_token_file: Option<std::path::PathBuf>,
    /// How long the leader's lease lasts unless renewed: the leader renews
    /// it every fifth of that, stops acting two thirds of it after its last
    /// renewal began, and a standby leads at most this plus a fifth after
    /// the leader stops.
    #[arg(long, env = "SANDBOXD_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// This process's name in the lease row (default: host:pid:random).
    #[arg(long, env = "SANDBOXD_HOLDER", value_parser = parse_holder)]
    pub holder: Option<String>,
    /// Reaping of deleted rows pauses when more than this share of the
    /// sandboxes with containers (released ones left out) lose their rows
    /// at once (1: never).
    #[arg(long, env = "SANDBOXD_REAP_BREAKER_SHARE", default_value_t = 0.5)]
    pub reap_breaker_share: f64,
    /// ...and at least this many.
    #[arg(long, env = "SANDBOXD_REAP_BREAKER_MIN", default_value_t = 5)]
    pub reap_breaker_min: usize,
    /// How many events each sandbox keeps in sandbox_events per owner (its
    /// newest: the next owner of a released id prunes none of the last
    /// one's; equal events in a row are one, counted), 1 to 1000.
    #[arg(long, env = "SANDBOXD_EVENTS_PER_SANDBOX", default_value_t = crate::config::DEFAULT_EVENTS_PER_SANDBOX,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::config::MAX_EVENTS_PER_SANDBOX)))]
    pub events_per_sandbox: u32,
    /// Events that last happened longer ago than this are deleted.
    #[arg(long, env = "SANDBOXD_EVENT_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub event_retention: Duration,
    /// Seeds (sandbox_seed_put) that no desired row has named for this
    /// long are deleted from the state database (a put counts as named);
    /// register one again to use it after that.
    #[arg(long, env = "SANDBOXD_SEED_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub seed_retention: Duration,
    /// POST every recorded event (JSON, signed with X-Sandboxd-Signature)
    /// to this https:// URL (the receiver's certificate verified), or
    /// http:// to a receiver on the same host or a trusted network; needs
    /// --webhook-secret-file. Never logged in full (its path and query may
    /// hold a token).
    #[arg(long, env = "SANDBOXD_WEBHOOK_URL", hide_env_values = true)]
    pub webhook_url: Option<String>,
    /// File holding the webhook's signing secret (at least 16 characters;
    /// surrounding whitespace is ignored).
    #[arg(long, env = "SANDBOXD_WEBHOOK_SECRET_FILE")]
    pub webhook_secret_file: Option<std::path::PathBuf>,
    /// PEM file of CA certificates trusted for an https:// webhook, besides
    /// the platform's (e.g. a private CA's).
    #[arg(long, env = "SANDBOXD_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: Option<std::path::PathBuf>,
    /// Bound on one webhook attempt (connect, send, response head).
    #[arg(long, env = "SANDBOXD_WEBHOOK_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub webhook_timeout: Duration,
    /// Attempts after the first for one event (exponential backoff from
    /// 0.5 s to 30 s), 0 to 10.
    #[arg(long, env = "SANDBOXD_WEBHOOK_RETRIES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(0..=10))]
    pub webhook_retries: u32,
    /// Events waiting for the webhook; past it new ones are dropped and
    /// counted (sandboxd_webhook_dropped_total), 1 to 100000.
    #[arg(long, env = "SANDBOXD_WEBHOOK_QUEUE", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub webhook_queue: u32,
    /// Host memory kept for the controller, its state database and dockerd:
    /// sandboxes are admitted while the sum of their memory caps (and the
    /// warm pools') fits in the host's memory minus this.
    #[arg(long, env = "SANDBOXD_MEMORY_RESERVE", default_value = "2GiB", value_parser = parse_size)]
    pub memory_reserve: u64,
    /// The memory budget for sandboxes, instead of the host's memory minus
    /// --memory-reserve (e.g. 16GiB).
    #[arg(long, env = "SANDBOXD_MEMORY_BUDGET", value_parser = parse_size)]
    pub memory_budget: Option<u64>,
}

impl RunArgs {
    /// The controller configuration these flags describe.
    pub fn to_config(&self) -> Result<ControllerConfig, crate::config::ConfigError> {
        let mut c = ControllerConfig::new(self.deployment.clone());
        c.network = match self.network_layout {
            NetworkLayoutArg::PerSandbox => NetworkLayout::PerSandbox {
                subnets: SubnetPool::new(self.subnet_pool, self.subnet_prefix)?,
                egress: self.allow_egress,
            },
            NetworkLayoutArg::Shared => NetworkLayout::Shared {
                name: self.network.clone(),
            },
        };
        c.controller_container = self.controller_container.clone();
        c.env_prefix = self.env_prefix.clone();
        c.images = Images::new(&self.images, &self.features_images)?;
        c.limits = Limits {
            memory_bytes: self.memory_mb * 1024 * 1024,
            nano_cpus: (self.cpus * 1e9) as i64,
            pids: self.pids,
            tmpfs_bytes: self.tmpfs_mb * 1024 * 1024,
            oom_score_adj: self.oom_score_adj,
            ..Limits::default()
        };
        c.warm_pool = crate::config::warm_pools(
            &self
                .warm_pool
                .iter()
                .flat_map(|e| e.split_whitespace())
                .map(String::from)
                .collect::<Vec<_>>(),
        )?;
        c.warm_pool_demand = crate::config::PoolDemand {
            max: self.warm_pool_demand,
            window: self.warm_pool_demand_window,
        };
        c.grace = self.grace;
        c.relist_interval = self.relist_interval;
        c.resync_interval = self.resync_interval;
        c.concurrency = self.concurrency;
        c.pull_timeout = self.pull_timeout;
        c.readiness = crate::config::readiness_overrides(&self.readiness_timeouts)?;
        c.idle_timeout = self.idle_timeout.filter(|d| !d.is_zero());
        c.docker_timeout = self.docker_timeout;
        c.stale_bridge_age = self.stale_bridge_age;
        c.store_timeout = self.store_timeout;
        c.reconcile_timeout = self.reconcile_timeout;
        c.stop_timeout = self.stop_timeout;
        c.probe_via = self.probe_via;
        c.isolation = self.runtime.into();
        c.metrics_addr = self.metrics_addr;
        c.shutdown_grace = self.shutdown_grace;
        c.image_build_command = self.image_build_command.clone();
        c.build_timeout = self.build_timeout;
        c.templates = self.templates;
        c.template_timeout = self.template_timeout;
        c.persistent_size = self.persistent_size;
        c.seed_loads = self.seed_loads;
        c.disks.dir.clone_from(&self.persistent_disks_dir);
        c.lease = crate::domain::lease::LeasePolicy::new(self.lease_duration)?;
        c.breaker = crate::domain::breaker::BreakerPolicy::new(
            self.reap_breaker_share,
            self.reap_breaker_min,
        )?;
        if let Some(holder) = &self.holder {
            c.holder.clone_from(holder);
        }
        c.events_per_sandbox = self.events_per_sandbox;
        c.event_retention = self.event_retention;
        c.seed_retention = self.seed_retention;
        c.webhook = crate::config::WebhookConfig::from_flags(
            self.webhook_url.as_deref(),
            self.webhook_secret_file.as_deref(),
            self.webhook_ca_file.as_deref(),
        )?
        .map(|w| crate::config::WebhookConfig {
            timeout: self.webhook_timeout,
            retries: self.webhook_retries,
            queue: self.webhook_queue as usize,
            ..w
        });
        if let Some(w) = &c.webhook {
            w.check()?;
        }
        c.memory_reserve = self.memory_reserve;
        c.memory_budget = self.memory_budget;
        c.backend = self.backend;
        c.swarm_publish = self.swarm_publish;
        c.swarm_helper_image = self.swarm_helper_image.clone();
        c.check_reconcile_timeout(crate::engine::REGISTRY)?;
        c.for_swarm()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use clap::Parser;
    use std::time::Duration;

    #[test]
    fn the_memory_reserve_and_budget_take_sizes_and_the_budget_defaults_to_the_hosts() {
        let run = |args: &[&str]| {
            Cli::try_parse_from(args).map(|c| match c.command {
                Command::Run(r) => r.to_config().unwrap(),
                other => panic!("{other:?}"),
            })
        };
        let c = run(&["sandboxd", "run"]).unwrap();
        assert_eq!(c.memory_reserve, 2 << 30);
        assert_eq!(c.memory_budget, None);
        let c = run(&[
            "sandboxd",
            "run",
            "--memory-reserve",
            "3GiB",
            "--memory-budget",
            "1.5GiB",
        ])
        .unwrap();
        assert_eq!(c.memory_reserve, 3 << 30);
        assert_eq!(c.memory_budget, Some(1536 << 20));
        let e = run(&["sandboxd", "run", "--memory-budget", "lots"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("use a number with B, KiB, MiB, GiB or TiB"),
            "{e}"
        );
    }
    #[test]
    fn the_runtime_flag_sets_the_least_isolation_level() {
        use crate::domain::isolation::Isolation;
        let config = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(r) => r.to_config().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(config(&["sandboxd", "run"]).isolation, Isolation::Container);
        for (value, want) in [
            ("runsc", Isolation::Gvisor),
            ("default", Isolation::Container),
            ("runc", Isolation::Container),
        ] {
            let c = config(&["sandboxd", "run", "--runtime", value]);
            assert_eq!(c.isolation, want, "{value}");
        }
        assert!(Cli::try_parse_from(["sandboxd", "run", "--runtime", "kata"]).is_err());
    }

    #[test]
    fn warm_pools_are_repeatable_flags_with_feature_sets() {
        let config = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(r) => r.to_config(),
            other => panic!("{other:?}"),
        };
        let c = config(&[
            "sandboxd",
            "run",
            "--warm-pool",
            "postgres=2",
            "--warm-pool",
            "postgres:vector,pg_trgm=1",
            "--warm-pool",
            "redis=2",
        ])
        .unwrap();
        assert_eq!(c.warm_pool.values().sum::<usize>(), 5);
        assert_eq!(c.warm_pool.len(), 3);
        assert!(config(&["sandboxd", "run"]).unwrap().warm_pool.is_empty());
        assert!(matches!(
            config(&["sandboxd", "run", "--warm-pool", "postgres"]),
            Err(crate::config::ConfigError::WarmPool(_))
        ));
    }
    #[test]
    fn the_webhook_flags_make_one_configuration_and_are_checked_at_start() {
        let config = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(r) => r.to_config(),
            other => panic!("{other:?}"),
        };
        let file = std::env::temp_dir().join(format!("sandboxd-cli-secret-{}", std::process::id()));
        std::fs::write(&file, "a-secret-of-twenty-chars\n").unwrap();
        let path = file.to_str().unwrap();
        let c = config(&[
            "sandboxd",
            "run",
            "--webhook-url",
            "http://127.0.0.1:8080/h?token=x",
            "--webhook-secret-file",
            path,
            "--webhook-timeout",
            "2s",
            "--webhook-retries",
            "5",
            "--webhook-queue",
            "10",
        ])
        .unwrap();
        let w = c.webhook.expect("a webhook");
        assert_eq!(w.url.to_string(), "http://127.0.0.1:8080/…");
        assert_eq!(w.secret.expose(), "a-secret-of-twenty-chars");
        assert_eq!(
            (w.timeout, w.retries, w.queue),
            (Duration::from_secs(2), 5, 10)
        );
        assert!(config(&["sandboxd", "run"]).unwrap().webhook.is_none());
        assert!(matches!(
            config(&["sandboxd", "run", "--webhook-secret-file", path]),
            Err(crate::config::ConfigError::Webhook(_))
        ));
        assert!(matches!(
            config(&[
                "sandboxd",
                "run",
                "--webhook-url",
                "http://h/",
                "--webhook-secret-file",
                path,
                "--webhook-timeout",
                "0s",
            ]),
            Err(crate::config::ConfigError::Webhook(_))
        ));
        assert!(Cli::try_parse_from([
            "sandboxd",
            "run",
            "--webhook-url",
            "http://h/",
            "--webhook-secret-file",
            path,
            "--webhook-queue",
            "0",
        ])
        .is_err());
        let https = config(&[
            "sandboxd",
            "run",
            "--webhook-url",
            "https://127.0.0.1:8443/h?token=x",
            "--webhook-secret-file",
            path,
        ]);
        // Verified against the platform's CAs alone (its TLS client, and
        // the error when there are none, are the transport's: see
        // `adapters::webhook_tls`).
        let w = https.unwrap().webhook.expect("a webhook");
        assert_eq!(w.url.to_string(), "https://127.0.0.1:8443/…");
        assert_eq!(w.tls, Some(crate::config::WebhookTrust::default()));
        assert!(matches!(
            config(&[
                "sandboxd",
                "run",
                "--webhook-url",
                "https://h/",
                "--webhook-secret-file",
                path,
                "--webhook-ca-file",
                path,
            ]),
            Err(crate::config::ConfigError::Webhook(_))
        ));
        std::fs::remove_file(&file).unwrap();
    }
}
