#!/usr/bin/env bash
# Runs the whole test suite against the real Docker engine and a real
# Postgres: checks Docker (starting dockerd if needed), builds the engine
# images from Debian packages if they are missing, runs `cargo test`, and
# removes anything a crashed test left behind.
#
# Without arguments, in two passes: every test but the integration tests'
# `alone::` module, side by side ($SANDBOXD_TEST_THREADS at a time, default
# 3: they mostly wait on Docker; four at once broke timing-sensitive tests
# on a loaded 2-core machine),
# then `alone::` (they create a Docker Swarm or churn a hundred networks:
# nothing else may run beside them), the Swarm backend's tests side by
# side on one Swarm, the rest one at a time. With arguments, one
# `cargo test` with exactly those, e.g.
#   scripts/test.sh --test integration -- events::
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_docker
ensure_host_firewall
ensure_engine_images
ensure_prometheus
ensure_netns_tools
ensure_example_tools
ensure_chromium
ensure_python_client
# The gVisor tests (tests/integration/gvisor.rs) run engines under runsc.
ensure_runsc install || log "WARNING: gVisor (runsc) is not registered with dockerd: the gvisor:: tests skip"

cleanup() {
  # Anything a crashed test left behind (a killed test process drops
  # nothing): sandboxes, networks and volumes of test deployments (`t` + random),
  # the tests' agent containers, and state databases.
  leftovers=$(docker ps -a --filter label=io.sandboxd.managed-by=sandboxd \
    --format '{{.ID}} {{.Label "io.sandboxd.deployment"}}' | awk '$2 ~ /^t[a-z0-9]+(-x)?$/ {print $1}')
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker network ls -q --filter label=sandboxd-test.churn)
  if [ -n "$leftovers" ]; then docker network rm $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker ps -aq --filter label=sandboxd-test.agent)
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker network ls --filter label=io.sandboxd.managed-by=sandboxd \
    --format '{{.ID}} {{.Label "io.sandboxd.deployment"}}' | awk '$2 ~ /^t[a-z0-9]+(-x)?$/ {print $1}')
  if [ -n "$leftovers" ]; then docker network rm $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker volume ls --filter label=io.sandboxd.managed-by=sandboxd \
    --format '{{.Name}} {{.Label "io.sandboxd.deployment"}}' | awk '$2 ~ /^t[a-z0-9]+(-x)?$/ {print $1}')
  if [ -n "$leftovers" ]; then docker volume rm -f $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker ps -aq --filter label=io.sandboxd.test-state)
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  # State databases that tests/integration/first_session.rs started through run.sh.
  leftovers=$(docker ps -a --filter label=io.sandboxd.state=true --format '{{.Names}}' | grep -E '^sandboxd-state-t[a-z0-9]+$' || true)
  if [ -n "$leftovers" ]; then docker rm -f -v $leftovers >/dev/null 2>&1 || true; fi
  leftovers=$(docker volume ls -q --filter label=io.sandboxd.state=true | grep -E '^sandboxd-state-t[a-z0-9]+$' || true)
  if [ -n "$leftovers" ]; then docker volume rm -f $leftovers >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
results=$(mktemp)
sim_log=$(mktemp)
bench_log=$(mktemp)
sim_pid=
bench_pid=
trap 'cleanup; for p in $sim_pid $bench_pid; do kill "$p" 2>/dev/null || true; kill -CONT "$p" 2>/dev/null || true; done; rm -f "$results" "$sim_log" "$bench_log"' EXIT
# Every test binary runs even when one fails, so one run shows every failure;
# a failed pass does not stop the next, and the script fails at the end.
status=0
run() {
  log "running cargo test $*"
  cargo test --no-fail-fast "$@" 2>&1 | tee -a "$results" || status=1
}
# The path of a test target's binary as the build names it ($1: the
# `cargo test` selection, e.g. --lib or --bench provision).
test_binary() {
  cargo test "$@" --no-run 2>&1 | sed -n 's/.*Executable .* (\(target\/.*\))$/\1/p' | head -n 1
}
# Waits for a run started beside a pass and adds its output to the results.
beside_wait() {
  local pid=$1 out=$2 what=$3 rc=0
  [ -n "$pid" ] || return 0
  wait "$pid" || rc=$?
  tee -a "$results" <"$out"
  if [ "$rc" -ne 0 ]; then
    log "$what failed (above)"
    status=1
  fi
}
# The simulation's ten thousand worlds (src/testing/dst) need only CPU,
# about two minutes of both cores; the integration tests mostly wait on
# Docker. So the sweep runs beside the passes under the idle scheduling
# class (it gets a core only when no test wants one) instead of adding its
# minutes after them.
SIM_TEST=testing::dst::tests::ten_thousand_seeded_worlds_keep_every_invariant
idle=(nice -n 19)
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0 "${idle[@]}"); fi
sim_beside() {
  local bin
  bin=$(test_binary --lib)
  if [ -z "$bin" ]; then
    log "the unit tests' binary was not found: the simulation runs in the first pass"
    return 1
  fi
  log "running the simulation sweep beside the tests (idle priority): $bin $SIM_TEST"
  "${idle[@]}" "$bin" "$SIM_TEST" --exact >"$sim_log" 2>&1 &
  sim_pid=$!
}
# Stops (STOP) or resumes (CONT) the sweep, if it still runs; its
# threads stop with it.
sim_hold() {
  [ -n "$sim_pid" ] || return 0
  kill -s "$1" "$sim_pid" 2>/dev/null || true
}
# The benchmark's smoke run (benches/provision.rs without --bench: one
# short pass, no report, no timing asserted) has its own controller and
# deployment, like any test; it runs beside the first pass, where it would
# otherwise add two minutes after it.
bench_beside() {
  local bin
  bin=$(test_binary --bench provision)
  if [ -z "$bin" ]; then
    log "the benchmark's binary was not found: its smoke run runs in the first pass"
    return 1
  fi
  log "running the benchmark's smoke run beside the first pass: $bin"
  "$bin" >"$bench_log" 2>&1 &
  bench_pid=$!
}
if [ $# -gt 0 ]; then
  run "$@"
else
  first=(--lib --bins --tests)
  bench_beside || first+=(--benches)
  skip=(--skip alone::)
  if sim_beside; then skip+=(--skip "$SIM_TEST"); fi
  run "${first[@]}" -- --test-threads="${SANDBOXD_TEST_THREADS:-3}" "${skip[@]}"
  beside_wait "$bench_pid" "$bench_log" "the benchmark's smoke run"
  bench_pid=
  # Nothing runs beside alone::, the sweep included: it is stopped for
  # these passes and goes on after.
  sim_hold STOP
  # The Swarm backend's tests hold one single-node Swarm together
  # (common::SingleNodeSwarm counts its holders and the last one out
  # leaves it), so they run side by side; every other alone:: test runs
  # by itself.
  run --test integration -- --test-threads=3 alone::swarm_backend::
  run --test integration -- --test-threads=1 alone:: --skip alone::swarm_backend::
  sim_hold CONT
  beside_wait "$sim_pid" "$sim_log" "the simulation sweep"
  sim_pid=
  # Tests that need an image this machine may not have are #[ignore]d; run
  # them when the image is there, and say so when it is not.
  if docker image inspect mongo:8 >/dev/null 2>&1; then
    # (the closing line counts these as run, no longer as skipped)
    echo "ignored tests run:" >>"$results"
    run --test integration -- --ignored mongo
  else
    log "SKIPPED a_mongo_row_becomes_ready_when_a_mongo_image_is_present: no mongo:8 image (Debian ships no MongoDB server; docker load one to run it)"
    log "SKIPPED a_mongo_sandbox_resets_to_its_checkpoint_and_to_the_empty_baseline: no mongo:8 image (as above)"
  fi
fi
# One closing line over every pass and test binary (a binary killed by a
# signal reports no result: it is counted apart).
awk '/^ignored tests run:/ { ran = 1 }
  /^test result:/ { p += $4; f += $6; i += ran ? -($4 + $6) : $8 }
  /process didn.t exit successfully: .*\(signal:/ { k += 1 }
  END {
    printf "tests: %d passed, %d failed, %d skipped", p, f, i
    if (k) printf " (%d test binaries killed before they reported)", k
    printf "\n"
  }' "$results"
exit "$status"
