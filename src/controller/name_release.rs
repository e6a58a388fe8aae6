//! A container name still held by a container Docker is removing.
//!
//! `docker rm -f` answers before the removal is done: until Docker has
//! deleted the container's files, the container (state `removing`) keeps
//! its name, and a create of that name is refused (`409 Conflict`). A heal
//! right after an operator's `docker rm -f` meets exactly that. The
//! runtime reports it as [`RuntimeError::NameBeingRemoved`]; the removal
//! is waited for here (bounded) and the call made once more, so the heal
//! goes on instead of failing the reconcile into back-off. A name held by
//! a live container is not this error and is never waited for.

use crate::domain::id::ContainerId;
use crate::ports::runtime::{Containers, RuntimeError};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How long a removal may take before the call fails: Docker deletes a
/// container's writable layer in well under a second on an idle host, a
/// few seconds on a loaded one.
pub(crate) const RELEASE_WITHIN: Duration = Duration::from_secs(10);

/// How often the holder is looked at meanwhile.
const POLL: Duration = Duration::from_millis(50);

/// `call` (a create or rename that takes a container name); while it
/// meets its name held by a container being removed, waits for that
/// container to be gone and makes the call again, for up to `within` in
/// all.
pub(crate) async fn once_released<T, F, Fut>(
    runtime: &(impl Containers + ?Sized),
    within: Duration,
    mut call: F,
) -> Result<T, RuntimeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RuntimeError>>,
{
    let deadline = Instant::now() + within;
    loop {
        match call().await {
            Err(RuntimeError::NameBeingRemoved { name, holder }) => {
                wait_gone(runtime, &name, &holder, deadline, within).await?;
            }
            other => return other,
        }
    }
}

/// Waits until `holder` (which holds the container name `name`) no longer
/// exists; [`RuntimeError::NameStillHeld`] naming both and the wait
/// `within` once `deadline` has passed.
async fn wait_gone(
    runtime: &(impl Containers + ?Sized),
    name: &str,
    holder: &ContainerId,
    deadline: Instant,
    within: Duration,
) -> Result<(), RuntimeError> {
    let started = Instant::now();
    tracing::info!(container = name, %holder, "the name is held by a container being removed; waiting for the removal");
    loop {
        if runtime.inspect(holder).await?.is_none() {
            tracing::info!(
                container = name,
                %holder,
                waited_ms = started.elapsed().as_millis() as u64,
                "the removal is done; the name is free"
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::NameStillHeld {
                name: name.to_owned(),
                holder: holder.clone(),
                after: within,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}
