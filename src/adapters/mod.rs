//! Adapters at the edge: Docker (containers or Swarm services) and Postgres behind the ports' traits, the
//! deadlines every call gets, and the HTTP endpoints.

pub mod chaos;
pub mod deadline;
pub mod docker;
pub(crate) mod host_net;
pub mod http;
pub mod postgres;
pub mod swarm;
pub mod webhook;
pub mod webhook_tls;

pub use self::docker::DockerRuntime;
pub use self::postgres::PgStore;
pub use self::swarm::SwarmRuntime;
