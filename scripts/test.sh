#!/usr/bin/env bash
# Runs the whole test suite against the real Docker engine and a real
# Postgres: checks Docker (starting dockerd if needed), builds the engine
# images from Debian packages if they are missing, starts a throwaway state
# Postgres, runs `cargo test`, and removes what it started.
# Arguments go to `cargo test` (default: --all-targets).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_docker
ensure_engine_images
ensure_prometheus

state=sandboxd-test-state
cleanup() {
  docker rm -f "$state" >/dev/null 2>&1 || true
  # Anything a crashed test left behind on the test network.
  leftovers=$(docker ps -aq --filter label=io.sandboxd.managed-by=sandboxd --filter network=sandboxd-test)
  if [ -n "$leftovers" ]; then docker rm -f $leftovers >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
docker rm -f "$state" >/dev/null 2>&1 || true
SANDBOXD_TEST_DATABASE_URL=$(start_state_db "$state" "$(random_password)")
export SANDBOXD_TEST_DATABASE_URL
docker network inspect sandboxd-test >/dev/null 2>&1 || docker network create sandboxd-test >/dev/null
log "state database ready; running cargo test"
if [ $# -eq 0 ]; then set -- --all-targets; fi
results=$(mktemp)
trap 'cleanup; rm -f "$results"' EXIT
cargo test "$@" 2>&1 | tee "$results"
# Tests that need an image this machine may not have are #[ignore]d; run
# them when the image is there, and say so when it is not.
if docker image inspect mongo:8 >/dev/null 2>&1; then
  cargo test --test provisioning -- --ignored mongo
else
  log "SKIPPED a_mongo_row_becomes_ready_when_a_mongo_image_is_present: no mongo:8 image (Debian ships no MongoDB server; docker load one to run it)"
fi
# One closing line over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$results"
