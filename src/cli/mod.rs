//! The command line: `run`, `migrate`, `apply`, `request`, `get`, `list`,
//! `describe`, `touch`, `checkpoint`, `reset`, `release` (alias `delete`), `quota`, `grant-orchestrator`,
//! `revoke-orchestrator`, `resume-reaping`, `chaos`, `completions`. Every
//! flag can also be set from the environment (`DATABASE_URL`,
//! `SANDBOXD_*`).
//!
//! Exit codes: 0 success; 1 an error; 2 invalid arguments; with `--wait`,
//! [`EXIT_FAILED`] when the sandbox failed and [`EXIT_TIMED_OUT`] when it was
//! not ready in time.

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

mod apply;
mod args;
mod chaos;
mod checkpoint;
mod console;
mod describe;
mod error;
mod fork;
mod get;
mod list;
mod migrate;
mod node_exec;
mod orchestrator;
mod progress;
mod quota;
mod reaping;
#[cfg(test)]
mod reference;
mod release;
mod request;
pub(crate) mod run;
mod seed;
mod table;
mod touch;

pub use self::args::parse::{parse_duration, parse_engine_duration};
pub use self::args::{
    ApplyArgs, ChaosArgs, Cli, Command, GetArgs, GetOutput, GrantArgs, IdleActionArg, LogFormat,
    NetworkLayoutArg, RequestArgs, RunArgs,
};
pub use self::describe::{DescribeArgs, DescribeOutput};
pub use self::error::{CliError, EXIT_FAILED, EXIT_TIMED_OUT};
pub use self::get::{export_line, export_lines};
pub use self::list::{ListArgs, ListOutput};
pub use self::progress::ProgressMode;
pub use self::run::{controller, webhook_client};

use clap::CommandFactory;

/// Runs the parsed command.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    if let Command::Completions { shell } = cli.command {
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "sandboxd", &mut std::io::stdout());
        return Ok(());
    }
    if let Command::NodeExec { container, command } = cli.command {
        // No state database: the helper talks to its node's engine only.
        return node_exec::run(&container, &command).await;
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

/// Runs `command` against the state database at `url`: one line per verb,
/// each in a file of its own.
async fn dispatch(command: Command, url: &str) -> Result<(), CliError> {
    match command {
        Command::Run(args) => run::run(url, &args).await,
        Command::Migrate => migrate::migrate(url).await,
        Command::Apply(args) => apply::apply(url, args).await,
        Command::Request(args) => request::request(url, args).await,
        Command::Get(args) => get::get(url, args).await,
        Command::List(args) => list::run(url, args).await,
        Command::Quota(command) => quota::run(url, command).await,
        Command::Seed(command) => seed::run(url, command).await,
        Command::Fork(args) => fork::fork(url, args).await,
        Command::Describe(args) => describe::run(url, args).await,
        Command::Completions { .. } | Command::NodeExec { .. } => Ok(()),
        Command::Touch { id } => touch::touch(url, id).await,
        Command::Resume { id, wait } => touch::resume(url, id, wait).await,
        Command::Checkpoint {
            id,
            name,
            wait,
            timeout,
        } => checkpoint::checkpoint(url, id, name, wait, timeout).await,
        Command::Reset {
            id,
            name,
            wait,
            timeout,
        } => checkpoint::reset(url, id, name, wait, timeout).await,
        Command::Release { id } => release::release(url, id).await,
        Command::GrantOrchestrator(args) => orchestrator::grant(url, args).await,
        Command::Chaos(args) => chaos::chaos(url, args).await,
        Command::ResumeReaping => reaping::resume(url).await,
        Command::RevokeOrchestrator { role } => orchestrator::revoke(url, role).await,
    }
}
