//! The container runtime port: what the controller asks of Docker, split
//! by role, one trait and one file each:
//!
//! - [`Host`]: the runtime itself and its host (whether it answers, the
//!   host's memory and OCI runtimes, and the [`Capabilities`] the backend
//!   declares);
//! - [`Containers`]: sandbox and pool containers, and their events;
//! - [`Networks`]: networks, who is on them, the host's bridges and routes;
//! - [`Volumes`]: named volumes and the short-lived containers that fill
//!   them (the template job, a fork's helper, a seed's file);
//! - [`Images`]: what is present locally, and pulls;
//! - [`Commands`]: commands run inside a running container.
//!
//! [`Runtime`] is every role at once, implemented for whatever implements
//! them all: a backend (say, Kubernetes) is added by implementing each role
//! and declaring in [`Capabilities`] what it cannot do. The controller
//! decides by those alone, never by which backend it runs on, and holds the
//! whole as `Arc<dyn Runtime>` (every role's methods are at hand on it); a
//! function that needs some roles takes just those, as
//! `&(impl Containers + Commands + ?Sized)` (which a `&dyn Runtime`, a
//! concrete adapter or a fake all satisfy), and code that holds a
//! concrete runtime imports the roles whose methods it calls.
//!
//! Every method may fail; none may be trusted to return promptly (the
//! controller bounds each call).

mod commands;
mod containers;
mod error;
mod host;
mod images;
mod networks;
mod resource;
mod volumes;

pub use self::commands::Commands;
pub use self::containers::{
    ContainerAction, ContainerSpec, Containers, EventStream, RuntimeEvent, Tmpfs,
};
pub use self::error::RuntimeError;
pub use self::host::{Capabilities, Host};
pub use self::images::Images;
pub use self::networks::{BridgeOutcome, NetworkSpec, NetworkStream, Networks, StaleBridge};
pub use self::resource::ObservedResource;
pub use self::volumes::{
    Disk, DiskStore, FileContent, Helper, TemplateJob, Volume, VolumeFill, Volumes,
};

/// The container runtime: every role at once. The controller holds one as
/// `Arc<dyn Runtime>`; anything that implements every role is one.
pub trait Runtime: Host + Containers + Networks + Volumes + Images + Commands + 'static {}

impl<T> Runtime for T where T: Host + Containers + Networks + Volumes + Images + Commands + 'static {}
