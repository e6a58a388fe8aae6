//! sandboxd: a Kubernetes-style reconciling controller that gives AI coding
//! agents throwaway Postgres, Redis, Valkey and Mongo sandboxes on Docker.
//!
//! An orchestrator writes rows into `sandbox_desired`; the [`controller`]
//! diffs them against labelled Docker containers and converges, publishing
//! endpoints and credentials to `sandbox_status`. `docs/contract.md` has the
//! contract; `docs/architecture.md` the architecture.
//!
//! - [`domain`]: the pure core (the model, `plan`, the status decision).
//! - [`engine`]: one type per database engine, and their registry.
//! - [`ports`]: what the controller needs from Docker and Postgres, as traits.
//! - [`adapters`]: Docker, Postgres and HTTP behind those traits.
//! - [`controller`]: reconcile, provision, relists, the run loop.
//! - [`client`]: the Rust API for orchestrators; [`cli`]: the command line.
#![warn(missing_docs)]

pub mod adapters;
pub mod chaos;
#[cfg(test)]
mod cited_tests;
pub mod cli;
pub mod client;
pub mod config;
pub mod controller;
pub mod domain;
pub mod engine;
pub(crate) mod fleet_hash;
#[cfg(test)]
mod layers;
pub mod metrics;
pub mod ports;
pub(crate) mod sched;
pub mod state_url;
/// In-memory fakes of Docker and the state store for the reconciler's
/// unit tests, and (feature `simulation`) the scale simulation.
#[cfg(any(test, feature = "simulation"))]
#[cfg_attr(not(test), allow(dead_code, unused_imports))]
pub mod testing;
pub(crate) mod watch;

/// The unit tests' allocator (see Cargo.toml's dev-dependencies).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
