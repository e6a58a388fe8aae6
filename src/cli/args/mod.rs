//! The command line's clap tree: the top-level [`Cli`], the verbs and the
//! flags of each (`sandboxd run`'s many in [`run`], the value parsers in
//! [`parse`]). Nothing here acts: `super::dispatch` hands each verb to its
//! file.

use super::progress::ProgressMode;
use super::{describe::DescribeArgs, list::ListArgs, quota, seed};
use crate::domain::id::{Deployment, SandboxId};
use crate::domain::isolation::Isolation;
use crate::domain::sandbox::IdleAction;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::time::Duration;

pub(crate) mod parse;
pub(super) mod run;

use self::parse::{parse_duration, parse_fault};
pub use self::run::{NetworkLayoutArg, RunArgs};

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
    /// Seeds, the data a sandbox's engine starts with: `seed put FILE
    /// --engine postgres` registers FILE's content and prints its hash,
    /// which `apply`/`request --seed postgres=HASH` names.
    #[command(subcommand)]
    Seed(seed::SeedCommand),
    /// Make a new sandbox whose engines start with a copy of another's
    /// data (its source keeps serving; the copy is taken with the source
    /// frozen for a moment), with fresh credentials: `fork SRC NEW
    /// --wait 60s`. With --wait: exit 0 when ready, 3 when failed, 4 when
    /// timed out.
    Fork(ForkArgs),
    /// Take back everything grant-orchestrator gave a role.
    RevokeOrchestrator {
        /// The role's name.
        role: String,
    },
    /// Not for operators: the one-shot helper `--backend swarm` runs on
    /// another node to run a command inside a sandboxd container there
    /// (docs/swarm.md, "Checkpoints on other nodes"). Prints the command's
    /// output and exits with its code; 125 when it could not run it.
    #[command(hide = true)]
    NodeExec {
        /// The container (sandboxd's) on this node's engine.
        #[arg(long)]
        container: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
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
    /// The isolation level: `container` (Docker's default runtime) or
    /// `gvisor` (gVisor's user-space kernel, runsc); default: the
    /// controller's --runtime, which a row can raise, never lower.
    #[arg(long, value_enum)]
    pub isolation: Option<IsolationArg>,
    /// The seed an engine starts with as ENGINE=HASH (the hash `sandboxd
    /// seed put` printed), repeatable or comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub seed: Vec<String>,
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

/// `--isolation`: the isolation level a row asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsolationArg {
    /// Docker's default runtime (runc).
    Container,
    /// gVisor's user-space kernel (runsc).
    Gvisor,
}

impl From<IsolationArg> for Isolation {
    fn from(a: IsolationArg) -> Self {
        match a {
            IsolationArg::Container => Isolation::Container,
            IsolationArg::Gvisor => Isolation::Gvisor,
        }
    }
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
    /// The isolation level: `container` or `gvisor`; default: keep the
    /// sandbox's (the controller's --runtime for a new one).
    #[arg(long, value_enum)]
    pub isolation: Option<IsolationArg>,
    /// The seed an engine starts with as ENGINE=HASH (the hash `sandboxd
    /// seed put` printed), repeatable or comma-separated; replaces the
    /// sandbox's seed for that engine (a change re-provisions it).
    #[arg(long, value_delimiter = ',')]
    pub seed: Vec<String>,
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

/// Flags of `sandboxd fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The sandbox to copy (one this role sees).
    pub source: SandboxId,
    /// The new sandbox's id.
    pub id: SandboxId,
    /// Who asks; must be the source's owner (a fork is its source's
    /// owner's).
    #[arg(long)]
    pub owner: Option<String>,
    /// Wait this long for the fork to be ready (e.g. 60s) and print its
    /// status. Exit 3 if it failed, 4 if it was not ready in time.
    #[arg(long, value_parser = parse::parse_duration)]
    pub wait: Option<Duration>,
    /// With --wait, print each phase the fork goes through on standard
    /// error: `auto` when it is a terminal, `always` or `never`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

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
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
