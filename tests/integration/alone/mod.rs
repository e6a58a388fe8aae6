//! Tests that change the host for everyone on it: they create and leave a
//! Docker Swarm, churn a hundred networks at once, or plant a stale bridge
//! with routes on the host (which any controller beside them removes).
//! They must not run beside any other test, so `scripts/test.sh` runs this
//! module in passes of its own after the rest: `swarm_backend`'s tests
//! side by side (they hold one [`crate::common::SingleNodeSwarm`]
//! together), then every other one at a time
//! (`cargo test --test integration -- --test-threads=1 alone:: --skip alone::swarm_backend::`).

mod network_scale;
mod stale_bridge;
mod swarm_backend;
mod swarm_images;
mod swarm_one_switch;
mod swarm_two_nodes;
