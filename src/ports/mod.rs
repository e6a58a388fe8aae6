//! What the controller needs from the world, as traits: a container
//! runtime (Docker today) and a state store (Postgres). The controller
//! holds them as `Arc<dyn …>`; `crate::adapters` implements them, and the
//! crate's test support has in-memory fakes that fail or hang on demand.

pub mod probes;
pub mod runtime;
pub mod store;
pub mod webhook;

pub use self::probes::{ControllerView, PoolView, Probes};
pub use self::runtime::{ContainerSpec, Runtime, RuntimeError, RuntimeEvent};
pub use self::store::{Store, StoreError};

/// An error from a client library, boxed so that the ports name no
/// adapter's types.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Where the controller's hints come from: each port's change stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamSource {
    /// The runtime's event stream (Docker events).
    Docker,
    /// The store's change notifications (`LISTEN sandbox_desired`).
    Postgres,
}

impl StreamSource {
    /// Every source, for metrics.
    pub const ALL: [StreamSource; 2] = [StreamSource::Docker, StreamSource::Postgres];

    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamSource::Docker => "docker",
            StreamSource::Postgres => "postgres",
        }
    }
}
