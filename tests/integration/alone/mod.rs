//! Tests that change the host for everyone on it: they create and leave a
//! Docker Swarm, churn a hundred networks at once, or plant a stale bridge
//! with routes on the host (which any controller beside them removes). They must not run
//! beside any other test, so `scripts/test.sh` runs this module in a pass
//! of its own, one test at a time, after the rest
//! (`cargo test --test integration -- --test-threads=1 alone::`).

mod network_scale;
mod stale_bridge;
mod swarm_backend;
mod swarm_images;
mod swarm_one_switch;
mod swarm_two_nodes;
