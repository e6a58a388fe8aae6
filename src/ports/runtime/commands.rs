//! Commands run inside a running container: setting up an engine's users
//! and databases, checkpoints and resets, a fork's copy in its helper, a
//! seed's load streamed through an engine's client.

use super::RuntimeError;
use crate::domain::container::{ByteStream, ExecOutput, FilterOutput};
use crate::domain::id::ContainerId;
use async_trait::async_trait;

/// Running commands inside a running container.
#[async_trait]
pub trait Commands: Send + Sync {
    /// Runs `cmd` inside the container with extra environment `env`.
    async fn exec(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        env: Vec<String>,
    ) -> Result<ExecOutput, RuntimeError>;
    /// Runs `cmd` inside the container with extra environment `env` and
    /// `input` on its standard input, written as it arrives and closed at
    /// its end (an input that ends early with an `Err` is not closed
    /// cleanly: the call fails with its reason). Returns the last `keep`
    /// bytes of its standard output and the first of its standard error.
    /// A runtime that cannot attach to a process's input refuses.
    async fn filter(
        &self,
        id: &ContainerId,
        cmd: &[&str],
        _env: Vec<String>,
        _input: ByteStream<'_>,
        _keep: usize,
    ) -> Result<FilterOutput, RuntimeError> {
        Err(RuntimeError::Refused(format!(
            "container {id}: this runtime cannot run `{}` with input",
            cmd.first().unwrap_or(&"")
        )))
    }
}
