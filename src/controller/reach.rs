//! Reaching a container's engine: where the controller connects to it
//! ([`probe_address`], by `--probe-via`) and running the engine's own
//! client inside the container ([`InContainer`]), for the readiness
//! probe, the feature check, a claim's new credentials and a seed's load.

use super::env::Env;
use crate::config::ProbeVia;
use crate::domain::container::{ByteStream, ExecOutput, FilterOutput};
use crate::domain::id::ContainerId;
use crate::engine::{Credentials, Engine, Exec, Target};
use crate::ports::runtime::{Commands, RuntimeError};
use async_trait::async_trait;

/// Where the controller reaches the engine of the container `id` (called
/// `name`) whose engine port is published on `host_port` (`--probe-via`):
/// the published port at 127.0.0.1, or at the Swarm node that runs the
/// task; or the engine's own port under the name the runtime resolves on
/// their network ([`crate::ports::runtime::Containers::probe_host`]).
pub(crate) async fn probe_address(
    env: &Env,
    engine: &'static dyn Engine,
    id: &ContainerId,
    name: &str,
    host_port: u16,
) -> Result<(String, u16), RuntimeError> {
    let runtime = env.runtime.as_ref();
    Ok(match env.config.probe_via {
        ProbeVia::Host => match runtime.published_host(id).await? {
            Some(node) => (node, host_port),
            None => ("127.0.0.1".to_owned(), host_port),
        },
        ProbeVia::Network => (runtime.probe_host(id, name).await?, engine.port()),
    })
}

/// Commands inside one container, through the runtime's [`Commands`].
pub(crate) struct InContainer<'a, R: Commands + ?Sized> {
    pub(crate) runtime: &'a R,
    pub(crate) id: &'a ContainerId,
}

impl<R: Commands + ?Sized> InContainer<'_, R> {
    /// The engine in this container, reached at `host:port` and logged in
    /// to with `credentials`.
    pub(crate) fn target<'t>(
        &'t self,
        host: &'t str,
        port: u16,
        credentials: &'t Credentials,
    ) -> Target<'t> {
        Target {
            host,
            port,
            credentials,
            exec: self,
        }
    }
}

#[async_trait]
impl<R: Commands + ?Sized> Exec for InContainer<'_, R> {
    async fn exec(&self, cmd: &[&str], env: Vec<String>) -> Result<ExecOutput, String> {
        self.runtime
            .exec(self.id, cmd, env)
            .await
            .map_err(|e| e.to_string())
    }

    async fn filter(
        &self,
        cmd: &[&str],
        env: Vec<String>,
        input: ByteStream<'_>,
        keep: usize,
    ) -> Result<FilterOutput, String> {
        self.runtime
            .filter(self.id, cmd, env, input, keep)
            .await
            .map_err(|e| e.to_string())
    }
}
