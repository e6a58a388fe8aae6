//! The container runtime port: what the controller asks of Docker, split
//! by role. Each role is a trait of its own, and one file here: the
//! runtime itself and its host ([`Host`]), [`Containers`], [`Networks`],
//! [`Volumes`] and the short-lived containers that fill them, [`Images`],
//! and commands run inside a container ([`Exec`]). A backend is the sum of
//! the roles: [`Runtime`] is every role at once, implemented for whatever
//! implements them all, so adding one (say, Kubernetes) means implementing
//! each role, and declaring in [`Capabilities`] what it cannot do. The
//! controller decides by those alone, never by which backend it runs on.
//!
//! Every method may fail; none may be trusted to return promptly (the
//! controller bounds each call). A module that calls the runtime imports the
//! roles it uses, and a function that needs one role takes that role.

mod containers;
mod error;
mod exec;
mod host;
mod images;
mod networks;
mod resource;
mod volumes;

pub use self::containers::{
    ContainerAction, ContainerSpec, Containers, EventStream, RuntimeEvent, Tmpfs,
};
pub use self::error::RuntimeError;
pub use self::exec::Exec;
pub use self::host::{Capabilities, Host};
pub use self::images::Images;
pub use self::networks::{BridgeOutcome, NetworkSpec, NetworkStream, Networks, StaleBridge};
pub use self::resource::ObservedResource;
pub use self::volumes::{
    Disk, DiskStore, FileContent, Helper, TemplateJob, Volume, VolumeFill, Volumes,
};

/// The container runtime: every role at once. The controller holds one as
/// `Arc<dyn Runtime>`; anything that implements every role is one.
pub trait Runtime: Host + Containers + Networks + Volumes + Images + Exec + 'static {}

impl<T> Runtime for T where T: Host + Containers + Networks + Volumes + Images + Exec + 'static {}
