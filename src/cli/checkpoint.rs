//! `sandboxd checkpoint` and `sandboxd reset`: record a sandbox's data
//! under a name, and bring it back to one (or to the baseline).

use super::CliError;
use crate::client::Client;
use crate::domain::id::SandboxId;
use std::time::Duration;

/// Asks for checkpoint `name` of `id`; with `wait`, until it is recorded
/// (at most `timeout`).
pub(super) async fn checkpoint(
    url: &str,
    id: SandboxId,
    name: String,
    wait: bool,
    timeout: Duration,
) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
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

/// Asks for a reset of `id` to checkpoint `name` (the baseline without
/// one); with `wait`, until it is done (at most `timeout`).
pub(super) async fn reset(
    url: &str,
    id: SandboxId,
    name: Option<String>,
    wait: bool,
    timeout: Duration,
) -> Result<(), CliError> {
    let client = Client::connect(url).await?;
    let what = name.as_deref().unwrap_or("the baseline");
    if wait {
        client.reset(&id, name.as_deref(), timeout).await?;
        say!("{id} reset to {what}");
    } else {
        let request = client.request_reset(&id, name.as_deref()).await?;
        say!("reset of {id} to {what} asked (request {request}); see sandboxd describe {id}");
    }
    Ok(())
}
