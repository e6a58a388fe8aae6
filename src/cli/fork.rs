//! `sandboxd fork`: a new sandbox starting with a copy of another's data.

use super::get::print_status;
use super::progress::{self, ProgressMode};
use super::CliError;
use crate::client::Client;
use crate::domain::id::SandboxId;
use clap::Args;
use std::time::Duration;

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
    #[arg(long, value_parser = super::args::parse::parse_duration)]
    pub wait: Option<Duration>,
    /// With --wait, print each phase the fork goes through on standard
    /// error: `auto` when it is a terminal, `always` or `never`.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

/// Forks the sandbox `args` name; with `--wait`, prints the fork's status
/// once ready.
pub(super) async fn fork(url: &str, args: ForkArgs) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    let revision = client
        .fork(&args.source, &args.id, args.owner.as_deref())
        .await?;
    match args.wait {
        Some(timeout) => {
            let status =
                progress::wait(&client, &args.id, &revision, timeout, args.progress).await?;
            print_status(&status);
        }
        None => say!(
            "forked {} into {} at generation {}",
            args.source,
            args.id,
            revision.generation
        ),
    }
    Ok(())
}
