#!/usr/bin/env bash
# Benchmarks provisioning against a floor measured in the same run (bare
# create+start plus readiness) and prints the ratios: checks Docker
# (starting dockerd if needed), builds the engine images from Debian
# packages if they are missing, runs `cargo bench --bench provision` (which
# starts its state Postgres through testcontainers), and removes anything a
# crashed run left behind.
# The table is printed and written to target/bench/provision.md (under
# $CARGO_TARGET_DIR when set). Arguments go to `cargo bench`.
# BENCH_ITERS, BENCH_BATCH_ITERS and BENCH_BATCH tune the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_docker
ensure_host_firewall
ensure_engine_images

cleanup() {
  # Anything a crashed bench left behind: floor containers and their
  # networks. Its sandboxes belong to a test deployment, which the bench's
  # own environment removes when it ends. (A test run's state databases are
  # left alone.)
  leftovers=$(docker ps -aq --filter label=io.sandboxd.bench)
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker network ls -q --filter label=io.sandboxd.bench)
  if [ -n "$leftovers" ]; then docker network rm $leftovers >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
log "running cargo bench"
cargo bench --bench provision "$@"
