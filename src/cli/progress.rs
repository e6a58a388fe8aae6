//! Waiting you can watch: `--wait` prints each phase the sandbox goes
//! through, with the time since the wait began, on a terminal.

use crate::client::{Client, ClientError, Revision};
use crate::domain::id::SandboxId;
use crate::domain::sandbox::SandboxStatus;
use clap::ValueEnum;
use std::io::IsTerminal;
use std::time::Duration;

/// When `--wait` prints the phases it sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    /// When standard error is a terminal.
    Auto,
    /// Always (on standard error).
    Always,
    /// Never.
    Never,
}

impl ProgressMode {
    fn shown(self) -> bool {
        match self {
            ProgressMode::Auto => std::io::stderr().is_terminal(),
            ProgressMode::Always => true,
            ProgressMode::Never => false,
        }
    }
}

/// Waits for `revision` of `id`, printing each phase seen on standard
/// error when `progress` says so: `    0.4s  provisioning  provisioning postgres`.
pub(super) async fn wait(
    client: &Client,
    id: &SandboxId,
    revision: &Revision,
    timeout: Duration,
    progress: ProgressMode,
) -> Result<SandboxStatus, ClientError> {
    let shown = progress.shown();
    client
        .wait_ready_watching(id, revision, timeout, |p| {
            if shown {
                let message = super::table::first_line(&super::table::printable(p.message), 100);
                let line = format!(
                    "{:>7.1}s  {:<14}{message}",
                    p.elapsed.as_secs_f64(),
                    p.phase.as_str()
                );
                eprintln!("{}", line.trim_end());
            }
        })
        .await
}
