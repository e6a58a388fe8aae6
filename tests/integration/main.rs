//! The integration tests: one test binary, so the crate and its
//! dependencies link once. Each module is one area of behaviour against the
//! real Docker engine and a real Postgres; `common` holds the fixtures.

mod common;

mod alone;
mod attach;
mod bounded_waits;
mod chaos;
mod checkpoints;
mod cli;
mod compose_stack;
mod deletion_safety;
mod density;
mod events;
mod examples;
mod features;
mod first_session;
mod fixtures;
mod forks;
mod gvisor;
mod hostile_rows;
mod identity;
mod incarnation;
mod isolation;
mod leadership;
mod lifecycle;
mod network_recovery;
mod notifications;
mod notify_queue;
mod observability;
mod operator_page;
mod own_images;
mod pause;
mod persistent_size;
mod pool;
mod provisioning;
mod python_client;
mod quotas;
mod requests;
mod roles;
mod rotation;
mod schema;
mod secrets_file;
mod seed_loads;
mod seeds;
mod state_restart;
mod templates;
mod tenant_state;
mod valkey;
mod workflows;
