//! The command line: `run`, `migrate`, `apply`, `request`, `get`, `list`,
//! `describe`, `touch`, `checkpoint`, `reset`, `release` (alias `delete`), `quota`, `grant-orchestrator`,
//! `revoke-orchestrator`, `resume-reaping`, `chaos`, `completions`. Every
//! flag can also be set from the environment (`DATABASE_URL`,
//! `SANDBOXD_*`).
//!
//! Exit codes: 0 success; 1 an error; 2 invalid arguments; with `--wait`,
//! [`EXIT_FAILED`] when the sandbox failed and [`EXIT_TIMED_OUT`] when it was
//! not ready in time.

use crate::adapters::postgres::RoleError;
use crate::adapters::{http, DockerRuntime, PgStore, SwarmRuntime};
use crate::client::{Client, ClientError, Request, SandboxRequest};
use crate::config::{
    parse_env_prefix, Backend, ControllerConfig, Images, NetworkLayout, ProbeVia, SwarmPublish,
};
use crate::controller::Controller;
use crate::domain::clock::SystemClock;
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::limits::Limits;
use crate::domain::network::{Ipv4Net, SubnetPool};
use crate::domain::sandbox::{IdleAction, SandboxStatus};
use crate::metrics::Metrics;
use crate::ports::{RuntimeError, StoreError};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Prints a line to stdout; a closed pipe (`sandboxd list | head`) ends
/// the process quietly instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

mod describe;
mod list;
mod progress;
mod quota;
mod table;

pub use self::describe::{DescribeArgs, DescribeOutput};
pub use self::list::{ListArgs, ListOutput};
pub use self::progress::ProgressMode;

/// Exit code of a command whose `--wait` ended with the sandbox `failed`.
pub const EXIT_FAILED: u8 = 3;
/// Exit code of a command whose `--wait` ended before the sandbox was ready.
pub const EXIT_TIMED_OUT: u8 = 4;

/// sandboxd: throwaway Postgres, Redis, Valkey and Mongo sandboxes on Docker,
/// reconciled from rows in Postgres.
#[derive(Debug, Parser)]
#[command(name = "sandboxd", version, about)]
pub struct Cli {
    /// State database (holds sandbox_desired and sandbox_status); without
    /// it or DATABASE_URL, the URL scripts/run.sh recorded in
    /// $SANDBOXD_HOME/database-url (default ~/.local/state/sandboxd).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Say on standard error which state database the command uses and
    /// where its URL came from (the password left out).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// Log format.
    #[arg(
        long,
        env = "SANDBOXD_LOG_FORMAT",
        global = true,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller (migrates first).
    Run(Box<RunArgs>),
    /// Apply database migrations and sync the engine allowlist, then exit.
    Migrate,
    /// Write a desired sandbox row, replacing what it asked before (the
    /// declarative upsert).
    Apply(ApplyArgs),
    /// Ask for a sandbox, adding to what it already has: creates it, or adds
    /// services, features and attached containers (never removes any).
    /// Every call makes a new generation, so a failed sandbox is retried at
    /// once. With --wait: exit 0 when ready, 3 when failed, 4 when timed out.
    Request(RequestArgs),
    /// Show a sandbox's status (JSON, with its credentials), or its
    /// environment variables as `export` lines.
    Get(GetArgs),
    /// List every sandbox: id, phase, engines, age, heals, message.
    List(ListArgs),
    /// Show one sandbox at a glance: phase, generation, each engine's
    /// endpoint, image, features and heals (credentials only with
    /// --show-secrets), its network, and its last events, newest last.
    Describe(DescribeArgs),
    /// Print a shell completion script for bash, zsh or fish, e.g.
    /// `sandboxd completions bash > ~/.local/share/bash-completion/completions/sandboxd`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Record a use of a sandbox, so that its idle timeout starts again.
    /// Fails when the sandbox is not desired or is being released: request
    /// it again.
    Touch {
        /// Sandbox id.
        id: SandboxId,
    },
    /// Resume a paused sandbox (one whose row asks to pause when idle):
    /// touch it, which wakes sandboxd, and wait until it is ready; print
    /// its status. Fails when the sandbox is not desired or is being
    /// released.
    Resume {
        /// Sandbox id.
        id: SandboxId,
        /// How long to wait for it to be ready again.
        #[arg(long, value_parser = parse_duration, default_value = "10s")]
        wait: Duration,
    },
    /// Record the sandbox's data as checkpoint NAME (replacing one of that
    /// name), to go back to later with `sandboxd reset ID NAME`. With
    /// --wait: until sandboxd recorded it (exit 3 when it failed, 4 when
    /// timed out).
    Checkpoint {
        /// Sandbox id.
        id: SandboxId,
        /// Checkpoint name: 1 to 31 characters from a-z, 0-9, _ and -
        /// (`baseline` is reserved).
        name: String,
        /// Wait until sandboxd recorded it.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits.
        #[arg(long, default_value = "2m", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Bring the sandbox's data back to checkpoint NAME, or without NAME to
    /// the baseline (the empty database with its features); same
    /// credentials and endpoint, connected clients' sessions are closed.
    /// With --wait: until sandboxd did (exit 3 when it failed, 4 when
    /// timed out).
    Reset {
        /// Sandbox id.
        id: SandboxId,
        /// Checkpoint name (default: the baseline).
        name: Option<String>,
        /// Wait until sandboxd did it.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits.
        #[arg(long, default_value = "2m", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Release a sandbox: delete its desired row; sandboxd tears the
    /// containers down.
    #[command(alias = "delete")]
    Release {
        /// Sandbox id.
        id: SandboxId,
    },
    /// Let an existing database role act as an orchestrator: write
    /// sandbox_desired, read sandbox_status and the allowlist, nothing else.
    /// Run with the controller's DATABASE_URL (the owner of the tables).
    GrantOrchestrator(GrantArgs),
    /// Resume reaping after the circuit breaker paused it (too many rows
    /// went missing at once): the sandboxes whose rows are missing now are
    /// torn down as usual. Check sandbox_desired first. Run with the
    /// controller's DATABASE_URL.
    ResumeReaping,
    /// Inject faults at random into one deployment's ready sandbox
    /// containers (kill, stop, remove, OOM), then check that sandboxd healed
    /// them: one container per desired engine, none leaked, every ready
    /// status's credentials log in, nothing of another deployment touched.
    /// For staging: it refuses to run without --yes. Exit 0 when every
    /// invariant held, 3 when one did not.
    Chaos(ChaosArgs),
    /// Per-owner limits (admission): `quota set OWNER --sandboxes N
    /// --memory 4GiB` (OWNER `*` is the default for every owner without a
    /// row of its own), `quota unset OWNER`, `quota list` (use against
    /// limit). Run with the controller's DATABASE_URL.
    #[command(subcommand)]
    Quota(quota::QuotaCommand),
    /// Take back everything grant-orchestrator gave a role.
    RevokeOrchestrator {
        /// The role's name.
        role: String,
    },
}

/// Flags of `sandboxd chaos`.
#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// The deployment whose containers are hit; no other is touched.
    #[arg(long, env = "SANDBOXD_DEPLOYMENT", default_value = "default")]
    pub deployment: Deployment,
    /// How many faults (at most 1000).
    #[arg(long, default_value_t = 20)]
    pub faults: usize,
    /// Spread over this long (at most 1h).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Which faults, comma-separated: kill, stop, remove, oom.
    #[arg(long, value_delimiter = ',', default_value = "kill,stop,remove,oom", value_parser = parse_fault)]
    pub kinds: Vec<crate::adapters::chaos::Fault>,
    /// Seed of the random choices (default: random; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How long the fleet may take to settle after the last fault.
    #[arg(long, default_value = "3m", value_parser = parse_duration)]
    pub settle: Duration,
    /// Write the report (JSON) here as well as to standard output.
    #[arg(long)]
    pub results: Option<std::path::PathBuf>,
    /// Yes, kill this deployment's containers.
    #[arg(long)]
    pub yes: bool,
}

fn parse_fault(s: &str) -> Result<crate::adapters::chaos::Fault, String> {
    crate::adapters::chaos::Fault::parse(s.trim())
        .ok_or_else(|| format!("unknown fault {s:?}: use kill, stop, remove or oom"))
}

/// Flags of `sandboxd grant-orchestrator`.
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// The role's name (create it first as a superuser: CREATE ROLE … LOGIN PASSWORD …).
    pub role: String,
    /// Only rows whose owner is the role's name: it sees no other owner's
    /// desired or status rows and cannot write rows for another owner.
    #[arg(long)]
    pub own_rows_only: bool,
}

/// `--network-layout` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkLayoutArg {
    /// One network per sandbox, no route out.
    PerSandbox,
    /// One network for every sandbox, with egress (weaker).
    Shared,
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
    /// per-sandbox attachable overlays; templates and warm pools off,
    /// persistent sandboxes refused; see docs/swarm.md).
    #[arg(long, env = "SANDBOXD_BACKEND", default_value = "docker")]
    pub backend: Backend,
    /// Under `--backend swarm`: `none` (engines answer on their overlay
    /// only) or `host` (each task publishes its engine port on its node's
    /// every address, as Swarm's host mode does: WEAKER, firewall the
    /// nodes; needed for --probe-via host).
    #[arg(long, env = "SANDBOXD_SWARM_PUBLISH", default_value = "none")]
    pub swarm_publish: SwarmPublish,
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
    /// How readiness checks reach containers.
    #[arg(long, env = "SANDBOXD_PROBE_VIA", default_value = "host")]
    pub probe_via: ProbeVia,
    /// Command run (`sh -c`, image as $1) when an image is absent and cannot
    /// be pulled, e.g. `deploy/images/build.sh`; the image is used if it then exists.
    #[arg(long, env = "SANDBOXD_IMAGE_BUILD_COMMAND")]
    pub image_build_command: Option<String>,
    /// Bound on the image build command.
    #[arg(long, env = "SANDBOXD_BUILD_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub build_timeout: Duration,
    /// Start non-persistent sandboxes from pre-initialised templates
    /// (built once per engine image and feature set, in the background):
    /// `on` or `off`.
    #[arg(long, env = "SANDBOXD_TEMPLATES", default_value = "on", value_parser = parse_switch)]
    pub templates: bool,
    /// Bound on one template job (initialising a template's data directory).
    #[arg(long, env = "SANDBOXD_TEMPLATE_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub template_timeout: Duration,
    /// How long SIGTERM waits for in-flight reconciles before exiting.
    #[arg(long, env = "SANDBOXD_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "SANDBOXD_METRICS_ADDR", default_value = "127.0.0.1:9187")]
    pub metrics_addr: SocketAddr,
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
    /// sandboxes with containers lose their rows at once (1: never).
    #[arg(long, env = "SANDBOXD_REAP_BREAKER_SHARE", default_value_t = 0.5)]
    pub reap_breaker_share: f64,
    /// ...and at least this many.
    #[arg(long, env = "SANDBOXD_REAP_BREAKER_MIN", default_value_t = 5)]
    pub reap_breaker_min: usize,
    /// How many events each sandbox keeps in sandbox_events (its newest;
    /// equal events in a row are one, counted), 1 to 1000.
    #[arg(long, env = "SANDBOXD_EVENTS_PER_SANDBOX", default_value_t = crate::config::DEFAULT_EVENTS_PER_SANDBOX,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::config::MAX_EVENTS_PER_SANDBOX)))]
    pub events_per_sandbox: u32,
    /// Events that last happened longer ago than this are deleted.
    #[arg(long, env = "SANDBOXD_EVENT_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub event_retention: Duration,
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

/// A size such as `2GiB`, `512MiB` or a byte count.
fn parse_size(s: &str) -> Result<u64, String> {
    crate::domain::admission::parse_bytes(s).ok_or_else(|| {
        format!("invalid size {s:?}: use a number with B, KiB, MiB, GiB or TiB (e.g. 2GiB)")
    })
}

/// `on` or `off` (also `true`/`false`, `1`/`0`).
fn parse_switch(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

/// A lease holder name: 1 to 200 printable characters.
fn parse_holder(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 200 || s.chars().any(char::is_control) {
        return Err(format!(
            "invalid holder {s:?}: use 1 to 200 printable characters (default: host:pid:random)"
        ));
    }
    Ok(s.to_owned())
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
        c.grace = self.grace;
        c.relist_interval = self.relist_interval;
        c.resync_interval = self.resync_interval;
        c.concurrency = self.concurrency;
        c.pull_timeout = self.pull_timeout;
        c.readiness = crate::config::readiness_overrides(&self.readiness_timeouts)?;
        c.idle_timeout = self.idle_timeout.filter(|d| !d.is_zero());
        c.docker_timeout = self.docker_timeout;
        c.store_timeout = self.store_timeout;
        c.reconcile_timeout = self.reconcile_timeout;
        c.stop_timeout = self.stop_timeout;
        c.probe_via = self.probe_via;
        c.metrics_addr = self.metrics_addr;
        c.shutdown_grace = self.shutdown_grace;
        c.image_build_command = self.image_build_command.clone();
        c.build_timeout = self.build_timeout;
        c.templates = self.templates;
        c.template_timeout = self.template_timeout;
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
        c.check_reconcile_timeout(crate::engine::REGISTRY)?;
        c.for_swarm()
    }
}

/// Flags of `sandboxd apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Sandbox id.
    #[arg(long)]
    pub id: SandboxId,
    /// Engines, comma-separated: postgres, redis, valkey, mongo.
    #[arg(long, value_delimiter = ',', required = true)]
    pub services: Vec<String>,
    /// Features as ENGINE=FEATURE, repeatable or comma-separated; a bare
    /// FEATURE belongs to the engine before it (postgres=vector,postgis).
    #[arg(long, value_delimiter = ',')]
    pub features: Vec<String>,
    /// Who asks (default: the database role the command connects as).
    #[arg(long, default_value = "")]
    pub owner: String,
    /// Docker container to connect to the sandbox's network (e.g. the
    /// agent's), repeatable or comma-separated; at most 16.
    #[arg(long, value_delimiter = ',')]
    pub attach: Vec<String>,
    /// Expire this long from now (e.g. 2h).
    #[arg(long, value_parser = parse_duration)]
    pub expires_in: Option<Duration>,
    /// Release the sandbox once unused (neither requested nor touched) this
    /// long, e.g. 30m; 0: never (default: the controller's --idle-timeout).
    #[arg(long, value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Keep the data on a named Docker volume instead of tmpfs; never idle-
    /// released or expired. Fixed once the sandbox exists.
    #[arg(long)]
    pub persistent: bool,
    /// The agent's Docker container: when it is gone, the sandbox is released.
    #[arg(long)]
    pub owner_container: Option<String>,
    /// What the sandbox becomes once idle: `release` (torn down) or
    /// `pause` (frozen with its data; `sandboxd resume`, a request or a
    /// touch resumes it).
    #[arg(long, value_enum, default_value = "release")]
    pub idle_action: IdleActionArg,
    /// Wait this long for the sandbox to be ready (e.g. 60s); print its
    /// status. Exit 3 if it failed, 4 if it was not ready in time.
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// With --wait, print each phase the sandbox goes through, with the
    /// time since the request, on standard error: `auto` when it is a
    /// terminal, `always` or `never`.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

/// `--idle-action`: what an idle sandbox becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdleActionArg {
    /// Torn down (status `terminating`).
    Release,
    /// Frozen with its data (status `paused`) until used again.
    Pause,
}

impl From<IdleActionArg> for IdleAction {
    fn from(a: IdleActionArg) -> Self {
        match a {
            IdleActionArg::Release => IdleAction::Release,
            IdleActionArg::Pause => IdleAction::Pause,
        }
    }
}

/// Flags of `sandboxd request`.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Sandbox id.
    pub id: SandboxId,
    /// Engines to add, comma-separated: postgres, redis, valkey, mongo (none:
    /// just request the sandbox again).
    #[arg(long, value_delimiter = ',')]
    pub services: Vec<String>,
    /// Features to add as ENGINE=FEATURE, repeatable or comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub features: Vec<String>,
    /// Who asks; must be the sandbox's owner if it exists (default: the
    /// database role the command connects as, for a new sandbox).
    #[arg(long)]
    pub owner: Option<String>,
    /// Release the sandbox once unused this long, e.g. 30m; 0: never
    /// (default: keep the sandbox's, or the controller's --idle-timeout).
    #[arg(long, value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Keep the data on a named Docker volume instead of tmpfs
    /// (`--persistent=false` asserts the opposite); fixed once the sandbox
    /// exists.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub persistent: Option<bool>,
    /// The agent's Docker container: when it is gone, the sandbox is released.
    #[arg(long)]
    pub owner_container: Option<String>,
    /// What the sandbox becomes once idle: `release` (torn down) or
    /// `pause` (frozen with its data; `sandboxd resume`, a request or a
    /// touch resumes it); default: keep the sandbox's (`release` for a new
    /// one).
    #[arg(long, value_enum)]
    pub idle_action: Option<IdleActionArg>,
    /// Docker container to connect to the sandbox's network, repeatable or
    /// comma-separated; added to those already connected.
    #[arg(long, value_delimiter = ',')]
    pub attach: Vec<String>,
    /// Wait this long for the sandbox to be ready (e.g. 60s) and print its
    /// status. Exit 3 if it failed, 4 if it was not ready in time.
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// With --wait, print `export NAME='value'` lines for every engine
    /// instead, for `eval "$(sandboxd request … --wait 60s --export)"`.
    #[arg(long, requires = "wait")]
    pub export: bool,
    /// With --wait, print each phase the sandbox goes through, with the
    /// time since the request, on standard error: `auto` when it is a
    /// terminal, `always` or `never`.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

/// Flags of `sandboxd get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// Sandbox id.
    pub id: SandboxId,
    /// `json` (the status row, with its credentials) or `env` (`export
    /// NAME='value'` lines for every engine, for `eval`).
    #[arg(short, long, value_enum, default_value = "json")]
    pub output: GetOutput,
    /// The same as `--output env`.
    #[arg(long, conflicts_with = "output")]
    pub env: bool,
}

/// `sandboxd get --output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GetOutput {
    /// The status row as JSON.
    Json,
    /// `export NAME='value'` lines.
    Env,
}

/// Parses `ENGINE=DURATION` (the engine is checked by the configuration).
pub fn parse_engine_duration(s: &str) -> Result<(String, Duration), String> {
    let (engine, duration) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: use ENGINE=DURATION, e.g. postgres=90s"))?;
    Ok((engine.trim().to_owned(), parse_duration(duration.trim())?))
}

/// Parses `250ms`, `30s`, `3m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: use e.g. 250ms, 30s, 3m, 1h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("duration {s:?} is out of range: use e.g. 250ms, 30s, 3m, 1h"))
}

/// Parses `--features` values (`ENGINE=FEATURE`) into features per engine.
/// `ENGINE=FEATURE` entries; an entry without `=` is one more feature of
/// the engine before it, so `postgres=vector,postgis` names two.
fn parse_features(values: &[String]) -> Result<BTreeMap<String, BTreeSet<String>>, CliError> {
    let mut features: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut engine: Option<&str> = None;
    for f in values {
        let (e, feature) = match f.split_once('=') {
            Some((e, feature)) => (Some(e), feature),
            None => (engine, f.as_str()),
        };
        let e = e
            .filter(|e| !e.is_empty() && !feature.is_empty())
            .ok_or_else(|| CliError::Feature(f.clone()))?;
        engine = Some(e);
        features
            .entry(e.to_owned())
            .or_default()
            .insert(feature.to_owned());
    }
    Ok(features)
}

/// `export NAME='value'`, safe for `eval` in a POSIX shell: the value is
/// single-quoted (a `'` becomes `'\''`), so nothing in it is expanded.
/// `None` when `name` is not a shell variable name.
pub fn export_line(name: &str, value: &str) -> Option<String> {
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then(|| format!("export {name}='{}'", value.replace('\'', r"'\''")))
}

/// [`export_line`]s for every engine's `env`; a name that is not a shell
/// variable name is refused rather than printed.
pub fn export_lines(status: &SandboxStatus) -> Result<Vec<String>, CliError> {
    let mut lines = Vec::new();
    for svc in status.services.values() {
        for (name, value) in &svc.env {
            lines.push(
                export_line(name, value).ok_or_else(|| CliError::UnsafeVariable {
                    id: status.id.clone(),
                    name: name.chars().filter(|c| !c.is_control()).take(80).collect(),
                })?,
            );
        }
    }
    Ok(lines)
}

/// Errors surfaced by the CLI.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No usable database URL.
    #[error(transparent)]
    NoDatabase(#[from] crate::state_url::StateUrlError),
    /// Bad flag values.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Bad --features value.
    #[error("invalid --features value {0:?}: use ENGINE=FEATURE, e.g. postgres=pg_trgm or postgres=vector,postgis")]
    Feature(String),
    /// Store failures.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Client failures.
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    /// Registering orchestrator roles failed.
    #[error(transparent)]
    Role(#[from] RoleError),
    /// Docker failures.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Controller failures.
    #[error(transparent)]
    Controller(#[from] crate::controller::ControllerError),
    /// HTTP server failures.
    #[error(transparent)]
    Http(#[from] http::HttpError),
    /// A chaos run could not run.
    #[error("{0}")]
    Chaos(String),
    /// A chaos run found an invariant broken (the report says which).
    #[error("chaos: an invariant did not hold (see unhealed, leaked, duplicate, lost_credentials and unconverged in the report)")]
    ChaosFound,
    /// A `sandboxd quota` argument is unusable.
    #[error("{0}")]
    Quota(String),
    /// The sandbox does not exist.
    #[error("no status for sandbox {0}: it was never applied, or sandboxd has not seen it yet")]
    NotFound(SandboxId),
    /// A touch found nothing to touch.
    #[error("sandbox {0} is not desired, has expired, or is being released: request it again (sandboxd request {0} --services …)")]
    NotDesired(SandboxId),
    /// The state database named in the file `scripts/run.sh` wrote does
    /// not answer.
    #[error("{error}\n(the URL came from {file}, which scripts/run.sh wrote when it started its state database: start it again with scripts/run.sh, or `docker start sandboxd-state`; or pass --database-url)")]
    RecordedUnreachable {
        /// The file.
        file: String,
        /// The connection failure.
        error: Box<CliError>,
    },
    /// A status holds an environment variable name a shell cannot take.
    #[error("the status of sandbox {id} has an environment variable named {name:?}, which is not a shell variable name; refusing to print it for eval (is the state database tampered with?)")]
    UnsafeVariable {
        /// Sandbox id.
        id: SandboxId,
        /// The name, without control characters.
        name: String,
    },
}

impl CliError {
    /// The process exit code: [`EXIT_FAILED`] when a waited-for sandbox
    /// failed, [`EXIT_TIMED_OUT`] when it was not ready in time, 1 otherwise
    /// (clap exits 2 on invalid arguments).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::RecordedUnreachable { error, .. } => error.exit_code(),
            CliError::Client(ClientError::Failed { .. }) => EXIT_FAILED,
            CliError::Client(ClientError::Timeout { .. }) => EXIT_TIMED_OUT,
            CliError::Client(ClientError::CheckpointFailed { .. }) => EXIT_FAILED,
            CliError::Client(ClientError::CheckpointTimeout { .. }) => EXIT_TIMED_OUT,
            CliError::ChaosFound => EXIT_FAILED,
            _ => 1,
        }
    }
}

impl CliError {
    /// Whether the state database could not be reached at all.
    fn is_unreachable(&self) -> bool {
        matches!(
            self,
            CliError::Store(StoreError::Connect(_))
                | CliError::Client(ClientError::Store(StoreError::Connect(_)))
        )
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory;
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "sandboxd", &mut std::io::stdout());
        return Ok(());
    }
    let variable = std::env::var("DATABASE_URL").ok();
    let (url, source) = crate::state_url::resolve(
        cli.database_url.clone(),
        variable.as_deref(),
        &crate::state_url::home(),
    )?;
    if cli.verbose {
        eprintln!(
            "sandboxd: state database {} (from {source})",
            crate::state_url::redacted(&url)
        );
    }
    let result = dispatch(cli.command, &url).await;
    match (result, source) {
        (Err(e), crate::state_url::Source::File(file)) if e.is_unreachable() => {
            Err(CliError::RecordedUnreachable {
                file: file.display().to_string(),
                error: Box::new(e),
            })
        }
        (result, _) => result,
    }
}

/// Runs `command` against the state database at `url`.
async fn dispatch(command: Command, url: &str) -> Result<(), CliError> {
    let url = url.to_owned();
    match command {
        Command::Run(args) => run_controller(&url, &args).await,
        Command::Migrate => {
            PgStore::connect(&url, 2).await?.migrate().await?;
            say!("migrations applied; engine allowlist synced");
            Ok(())
        }
        Command::Apply(args) => apply(&url, args).await,
        Command::Request(args) => request(&url, args).await,
        Command::Get(args) => {
            let client = Client::connect(&url).await?;
            let status = client
                .status(&args.id)
                .await?
                .ok_or_else(|| CliError::NotFound(args.id.clone()))?;
            if args.env || args.output == GetOutput::Env {
                for line in export_lines(&status)? {
                    say!("{line}");
                }
            } else {
                print_status(&status);
            }
            Ok(())
        }
        Command::List(args) => list::run(&url, args).await,
        Command::Quota(command) => quota::run(&url, command).await,
        Command::Describe(args) => describe::run(&url, args).await,
        Command::Completions { .. } => Ok(()),
        Command::Touch { id } => {
            let client = Client::connect(&url).await?;
            if client.touch(&id).await? {
                say!("touched {id}");
                Ok(())
            } else {
                Err(CliError::NotDesired(id))
            }
        }
        Command::Resume { id, wait } => {
            let client = Client::connect(&url).await?;
            match client.resume(&id, wait).await? {
                Some(status) => {
                    print_status(&status);
                    Ok(())
                }
                None => Err(CliError::NotDesired(id)),
            }
        }
        Command::Checkpoint {
            id,
            name,
            wait,
            timeout,
        } => {
            let client = Client::connect(&url).await?;
            if wait {
                let c = client.checkpoint(&id, &name, timeout).await?;
                let size = c.size_bytes.map_or(0, |b| u64::try_from(b).unwrap_or(0));
                say!(
                    "checkpoint {name} of {id} recorded ({})",
                    crate::domain::checkpoint::mib(size)
                );
            } else {
                let request = client.request_checkpoint(&id, &name).await?;
                say!("checkpoint {name} of {id} asked (request {request}); see sandboxd describe {id}");
            }
            Ok(())
        }
        Command::Reset {
            id,
            name,
            wait,
            timeout,
        } => {
            let client = Client::connect(&url).await?;
            let what = name.as_deref().unwrap_or("the baseline");
            if wait {
                client.reset(&id, name.as_deref(), timeout).await?;
                say!("{id} reset to {what}");
            } else {
                let request = client.request_reset(&id, name.as_deref()).await?;
                say!(
                    "reset of {id} to {what} asked (request {request}); see sandboxd describe {id}"
                );
            }
            Ok(())
        }
        Command::Release { id } => {
            let client = Client::connect(&url).await?;
            if client.release(&id).await? {
                say!("released {id}; sandboxd tears its containers down");
            } else {
                say!("{id} was not desired; nothing to release");
            }
            Ok(())
        }
        Command::GrantOrchestrator(args) => {
            let store = PgStore::connect(&url, 1).await?;
            store
                .grant_orchestrator(&args.role, args.own_rows_only)
                .await?;
            let rows = if args.own_rows_only {
                format!("only rows whose owner is {:?}", args.role)
            } else {
                "every row".to_owned()
            };
            say!(
                "granted {:?}: it may write sandbox_desired and read sandbox_status ({rows})",
                args.role
            );
            Ok(())
        }
        Command::Chaos(args) => chaos(&url, args).await,
        Command::ResumeReaping => {
            let store = PgStore::connect(&url, 1).await?;
            match store.resume_reaping().await? {
                Some(pause) => {
                    let since = pause
                        .paused_at
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                        .unwrap_or_default();
                    say!(
                        "reaping resumed; it had been paused since {since}: {}",
                        pause.reason
                    );
                }
                None => say!("reaping was not paused; nothing to resume"),
            }
            Ok(())
        }
        Command::RevokeOrchestrator { role } => {
            let store = PgStore::connect(&url, 1).await?;
            if store.revoke_orchestrator(&role).await? {
                say!("revoked {role:?}: it no longer sees or writes sandboxd's tables");
            } else {
                say!("{role:?} was not registered as an orchestrator; it holds no privileges on sandboxd's tables now");
            }
            Ok(())
        }
    }
}

async fn chaos(url: &str, args: ChaosArgs) -> Result<(), CliError> {
    if !args.yes {
        return Err(CliError::Chaos(format!(
            "sandboxd chaos kills, stops and removes the containers of deployment {:?}; run it against staging, and pass --yes",
            args.deployment.as_str()
        )));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let options = crate::chaos::ChaosOptions {
        deployment: args.deployment.clone(),
        faults: args.faults,
        duration: args.duration,
        kinds: args.kinds.clone(),
        seed,
        settle: args.settle,
    };
    let chaos_error = |e: crate::chaos::ChaosError| CliError::Chaos(e.to_string());
    let docker = crate::adapters::DockerRuntime::connect().await?;
    let store = std::sync::Arc::new(PgStore::connect(url, 4).await?);
    let run = crate::chaos::Chaos::new(docker, store, options).map_err(chaos_error)?;
    let others = run.others().await.map_err(chaos_error)?;
    eprintln!(
        "chaos: {} faults over {:?} in deployment {} (seed {seed})",
        args.faults,
        args.duration,
        args.deployment.as_str()
    );
    let records = run.inject().await;
    let report = run.check(records, &others).await.map_err(chaos_error)?;
    let json = serde_json::to_string_pretty(&report).expect("the report is JSON");
    if let Some(path) = &args.results {
        std::fs::write(path, &json)
            .map_err(|e| CliError::Chaos(format!("cannot write {}: {e}", path.display())))?;
    }
    say!("{json}");
    if report.passed() {
        Ok(())
    } else {
        Err(CliError::ChaosFound)
    }
}

fn print_status(s: &SandboxStatus) {
    let services: BTreeMap<_, _> = s
        .services
        .iter()
        .map(|(k, v)| (k, serde_json::to_value(v).expect("status is JSON")))
        .collect();
    let doc = serde_json::json!({
        "id": s.id.as_str(),
        "phase": s.phase,
        "observed_generation": s.observed_generation,
        "incarnation": s.incarnation.as_ref().map(|i| i.as_str()),
        "message": s.message,
        "services": services,
        "network": s.network,
        "updated_at": s.updated_at,
    });
    say!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
}

async fn apply(url: &str, args: ApplyArgs) -> Result<(), CliError> {
    let req = SandboxRequest {
        owner: args.owner,
        services: args.services,
        features: parse_features(&args.features)?,
        attach: args.attach,
        expires_at: args.expires_in.map(|d| {
            chrono::Utc::now() + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
        }),
        idle_timeout: args.idle_timeout,
        persistent: args.persistent,
        owner_container: args.owner_container,
        idle_action: args.idle_action.into(),
    };
    let client = Client::connect(url).await?;
    let revision = client.apply(&args.id, &req).await?;
    match args.wait {
        Some(timeout) => print_status(
            &progress::wait(&client, &args.id, &revision, timeout, args.progress).await?,
        ),
        None => say!("applied {} at generation {}", args.id, revision.generation),
    }
    Ok(())
}

async fn request(url: &str, args: RequestArgs) -> Result<(), CliError> {
    let req = Request {
        owner: args.owner,
        services: args.services,
        features: parse_features(&args.features)?,
        idle_timeout: args.idle_timeout,
        persistent: args.persistent,
        owner_container: args.owner_container,
        attach: args.attach,
        idle_action: args.idle_action.map(Into::into),
    };
    let client = Client::connect(url).await?;
    let revision = client.request(&args.id, &req).await?;
    match args.wait {
        Some(timeout) => {
            let status =
                progress::wait(&client, &args.id, &revision, timeout, args.progress).await?;
            if args.export {
                for line in export_lines(&status)? {
                    say!("{line}");
                }
            } else {
                print_status(&status);
            }
        }
        None => say!(
            "requested {} at generation {}",
            args.id,
            revision.generation
        ),
    }
    Ok(())
}

async fn run_controller(url: &str, args: &RunArgs) -> Result<(), CliError> {
    let config = args.to_config()?;
    // Migrations get the default bound; the controller's statements
    // --store-timeout, enforced by the server too.
    let engines = crate::engine::REGISTRY;
    let migrate_timeout = crate::adapters::postgres::DEFAULT_STATEMENT_TIMEOUT;
    PgStore::connect_with_engines(url, 1, migrate_timeout, engines)
        .await?
        .migrate()
        .await?;
    let store = PgStore::connect_with_engines(
        url,
        (config.concurrency as u32 * 2).clamp(4, 32),
        config.store_timeout,
        engines,
    )
    .await?;
    let docker = DockerRuntime::connect()
        .await?
        .with_stream_timeout(config.docker_timeout);
    let runtime: Arc<dyn crate::ports::Runtime> = match config.backend {
        Backend::Docker => Arc::new(docker),
        Backend::Swarm => {
            tracing::info!(publish = ?config.swarm_publish, "backend: Swarm services");
            let egress = match &config.network {
                NetworkLayout::PerSandbox { egress, .. } => *egress,
                NetworkLayout::Shared { .. } => true,
            };
            Arc::new(
                SwarmRuntime::connect(docker, config.swarm_publish, egress)
                    .await?
                    .with_stop_grace(config.stop_timeout),
            )
        }
    };
    let metrics = Arc::new(Metrics::new());
    let controller = Controller::new(
        runtime,
        Arc::new(store),
        config.clone(),
        Arc::new(SystemClock),
        metrics.clone(),
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(signals(stop_tx));
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (bound, server) = http::serve(
        config.metrics_addr,
        metrics,
        controller.probes(),
        stopped(stop_rx.clone()),
    )
    .await?;
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    let server = tokio::spawn(server);
    controller.run(stopped(stop_rx)).await?;
    let _ = server.await;
    tracing::info!("controller stopped");
    Ok(())
}

/// First SIGTERM/SIGINT: graceful stop. Second: exit at once.
async fn signals(stop: tokio::sync::watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!(
        "signal received; finishing in-flight reconciles (signal again to exit at once)"
    );
    let _ = stop.send(true);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal; exiting now");
    std::process::exit(130);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_common_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("3 days").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn a_bare_feature_belongs_to_the_engine_before_it() {
        let list = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let got = parse_features(&list(&["postgres=vector", "postgis", "redis=json"])).unwrap();
        assert_eq!(
            got["postgres"],
            ["postgis", "vector"].map(String::from).into()
        );
        assert_eq!(got["redis"], ["json"].map(String::from).into());
        assert!(parse_features(&list(&["vector"])).is_err());
        assert!(parse_features(&list(&["postgres="])).is_err());
    }

    #[test]
    fn durations_out_of_range_are_refused_rather_than_panicking() {
        assert!(parse_duration("99999999999999999999999h").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn export_lines_evaluate_to_exactly_the_values_whatever_they_hold() {
        let values = [
            "plain",
            "it's",
            "''",
            "$(echo pwned) `id` $HOME \\ \"",
            "two\nlines",
            "",
        ];
        let mut script = String::new();
        for (i, value) in values.iter().enumerate() {
            script.push_str(&export_line(&format!("V{i}"), value).unwrap());
            script.push('\n');
            script.push_str(&format!("printf '%s\\0' \"$V{i}\"\n"));
        }
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: Vec<&str> = std::str::from_utf8(&out.stdout)
            .unwrap()
            .split_terminator('\0')
            .collect();
        assert_eq!(printed, values);
    }

    #[test]
    fn idle_action_and_resume_parse_and_request_keeps_the_row_s_action_unless_given() {
        let command = |args: &[&str]| Cli::try_parse_from(args).unwrap().command;
        match command(&["sandboxd", "request", "agent-7", "--idle-action", "pause"]) {
            Command::Request(r) => assert_eq!(r.idle_action, Some(IdleActionArg::Pause)),
            other => panic!("{other:?}"),
        }
        match command(&["sandboxd", "request", "agent-7"]) {
            Command::Request(r) => assert_eq!(r.idle_action, None),
            other => panic!("{other:?}"),
        }
        match command(&[
            "sandboxd",
            "apply",
            "--id",
            "agent-7",
            "--services",
            "redis",
        ]) {
            Command::Apply(a) => assert_eq!(IdleAction::from(a.idle_action), IdleAction::Release),
            other => panic!("{other:?}"),
        }
        match command(&["sandboxd", "resume", "agent-7", "--wait", "2s"]) {
            Command::Resume { id, wait } => {
                assert_eq!(id.as_str(), "agent-7");
                assert_eq!(wait, Duration::from_secs(2));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::try_parse_from(["sandboxd", "request", "a", "--idle-action", "sleep"]).is_err()
        );
    }

    #[test]
    fn export_lines_refuse_names_a_shell_would_misread() {
        assert!(export_line("SANDBOX_DB_HOST", "x").is_some());
        assert!(export_line("_X1", "x").is_some());
        for name in ["", "1X", "A-B", "A B", "X;rm", "X=Y", "A$B", "Ä"] {
            assert!(export_line(name, "x").is_none(), "{name:?}");
        }
    }

    #[test]
    fn exit_codes_tell_a_failed_sandbox_from_one_not_ready_in_time() {
        let id = SandboxId::parse("agent-7").unwrap();
        let failed = CliError::Client(ClientError::Failed {
            id: id.clone(),
            message: "why".into(),
        });
        let timed_out = CliError::Client(ClientError::Timeout {
            id: id.clone(),
            timeout: Duration::from_secs(1),
            phase: "provisioning".into(),
        });
        assert_eq!(failed.exit_code(), EXIT_FAILED);
        assert_eq!(timed_out.exit_code(), EXIT_TIMED_OUT);
        assert_eq!(CliError::NotDesired(id).exit_code(), 1);
        assert_eq!(
            CliError::NoDatabase(crate::state_url::StateUrlError::Empty(Default::default()))
                .exit_code(),
            1
        );
    }

    #[test]
    fn request_takes_persistent_as_a_flag_or_with_a_value() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Request(r) => r,
            other => panic!("{other:?}"),
        };
        let r = parse(&["sandboxd", "request", "agent-7", "--persistent"]);
        assert_eq!(r.persistent, Some(true));
        let r = parse(&["sandboxd", "request", "--persistent=false", "agent-7"]);
        assert_eq!(r.persistent, Some(false));
        let r = parse(&[
            "sandboxd",
            "request",
            "agent-7",
            "--services",
            "postgres,redis",
        ]);
        assert_eq!(r.persistent, None);
        assert_eq!(r.services, ["postgres", "redis"]);
        assert!(Cli::try_parse_from(["sandboxd", "request", "agent-7", "--export"]).is_err());
        assert!(matches!(
            Cli::try_parse_from(["sandboxd", "delete", "agent-7"])
                .unwrap()
                .command,
            Command::Release { .. }
        ));
    }

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
    fn quota_set_takes_numbers_sizes_or_unlimited() {
        let set = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Quota(quota::QuotaCommand::Set(s))) => Ok((s.sandboxes, s.memory)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        use crate::adapters::postgres::QuotaSetting;
        assert_eq!(
            set(&[
                "sandboxd",
                "quota",
                "set",
                "*",
                "--sandboxes",
                "2",
                "--memory",
                "4GiB"
            ]),
            Ok((Some(QuotaSetting::To(2)), Some(QuotaSetting::To(4 << 30))))
        );
        assert_eq!(
            set(&["sandboxd", "quota", "set", "a", "--memory", "unlimited"]),
            Ok((None, Some(QuotaSetting::Unlimited)))
        );
        for bad in ["--sandboxes=-1", "--sandboxes=many"] {
            let e = set(&["sandboxd", "quota", "set", "a", bad]).unwrap_err();
            assert!(e.contains("use a number (0 or more) or `unlimited`"), "{e}");
        }
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
        // Verified against the platform's CAs (none on a bare machine: an
        // error at start, never an unverified connection).
        match https {
            Ok(c) => {
                let w = c.webhook.expect("a webhook");
                assert_eq!(w.url.to_string(), "https://127.0.0.1:8443/…");
                assert!(w.tls.expect("its TLS").roots() > 0);
            }
            Err(e) => assert!(
                matches!(
                    e,
                    crate::config::ConfigError::Webhook(crate::config::WebhookConfigError::Tls(
                        crate::config::WebhookTlsError::NoRoots
                    ))
                ),
                "{e}"
            ),
        }
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

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
