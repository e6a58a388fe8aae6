//! `sandboxd touch` and `sandboxd resume`: record a use of a sandbox (its
//! idle timeout starts again; a paused one wakes), and for `resume` wait
//! until it is ready.

use super::get::print_status;
use super::CliError;
use crate::client::Client;
use crate::domain::id::SandboxId;
use std::time::Duration;

/// Records a use of `id`.
pub(super) async fn touch(url: &str, id: SandboxId) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    if client.touch(&id).await? {
        say!("touched {id}");
        Ok(())
    } else {
        Err(CliError::NotDesired(id))
    }
}

/// Touches `id` and waits up to `wait` for it to be ready; prints its status.
pub(super) async fn resume(url: &str, id: SandboxId, wait: Duration) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    match client.resume(&id, wait).await? {
        Some(status) => {
            print_status(&status);
            Ok(())
        }
        None => Err(CliError::NotDesired(id)),
    }
}
