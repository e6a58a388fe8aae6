//! Adapters at the edge: Docker and Postgres behind the ports' traits, the
//! deadlines every call gets, and the HTTP endpoints.

pub mod chaos;
pub mod deadline;
pub mod docker;
pub mod http;
pub mod postgres;

pub use self::docker::DockerRuntime;
pub use self::postgres::PgStore;
