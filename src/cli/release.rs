//! `sandboxd release` (alias `delete`): delete a sandbox's desired row;
//! sandboxd tears its containers down.

use super::CliError;
use crate::client::Client;
use crate::domain::id::SandboxId;

/// Releases `id`, saying whether there was anything to release.
pub(super) async fn release(url: &str, id: SandboxId) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    if client.release(&id).await? {
        say!("released {id}; sandboxd tears its containers down");
    } else {
        say!("{id} was not desired; nothing to release");
    }
    Ok(())
}
