//! sandboxd: a Kubernetes-style reconciling controller that gives AI coding
//! agents throwaway Postgres, Redis and Mongo sandboxes on Docker.
//!
//! An orchestrator writes rows into `sandbox_desired`; the [`controller`]
//! diffs them against labelled Docker containers and converges, publishing
//! endpoints and credentials to `sandbox_status`. See `README.md` for the
//! contract and `../shared/DESIGN.md` for the architecture.
#![warn(missing_docs)]

pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod controller;
pub mod engine;
pub mod heal_loop;
pub mod http;
pub mod id;
pub mod labels;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod provision;
pub mod queue;
pub mod reconcile;
pub mod runtime;
pub mod secret;
pub mod store;
pub mod watch;
