//! Tests that change the host for everyone on it: they create and leave a
//! Docker Swarm, or churn a hundred networks at once. They must not run
//! beside any other test, so `scripts/test.sh` runs this module in a pass
//! of its own, one test at a time, after the rest
//! (`cargo test --test integration -- --test-threads=1 alone::`).

mod network_scale;
mod swarm_backend;
mod swarm_images;
mod swarm_two_nodes;
