#!/usr/bin/env bash
# Benchmarks provisioning against a floor measured in the same run (bare
# create+start plus readiness) and prints the ratios: checks Docker
# (starting dockerd if needed), builds the engine images from Debian
# packages if they are missing, starts a throwaway state Postgres, runs
# `cargo bench --bench provision`, and removes what it started.
# The table is printed and written to target/bench/provision.md (under
# $CARGO_TARGET_DIR when set). Arguments go to `cargo bench`.
# BENCH_ITERS, BENCH_BATCH_ITERS and BENCH_BATCH tune the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_docker
ensure_engine_images

# Names distinct from scripts/test.sh's, so both can run side by side.
state=sandboxd-bench-state
cleanup() {
  docker rm -f "$state" >/dev/null 2>&1 || true
  # Anything a crashed bench left behind: floor containers, then sandboxes
  # on the bench network.
  leftovers=$(docker ps -aq --filter label=io.sandboxd.bench)
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker ps -aq --filter label=io.sandboxd.managed-by=sandboxd --filter network=sandboxd-bench)
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  docker network rm sandboxd-bench >/dev/null 2>&1 || true
}
trap cleanup EXIT
docker rm -f "$state" >/dev/null 2>&1 || true
SANDBOXD_TEST_DATABASE_URL=$(start_state_db "$state" "$(random_password)")
export SANDBOXD_TEST_DATABASE_URL
# The fixtures attach to sandboxd-test; the bench's containers use sandboxd-bench.
for net in sandboxd-test sandboxd-bench; do
  docker network inspect "$net" >/dev/null 2>&1 || docker network create "$net" >/dev/null
done
log "state database ready; running cargo bench"
cargo bench --bench provision "$@"
