//! `sandboxd fork`: a new sandbox starting with a copy of another's data.

use super::args::ForkArgs;
use super::get::print_status;
use super::progress;
use super::CliError;
use crate::client::Client;

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
