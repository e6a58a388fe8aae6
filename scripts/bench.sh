#!/usr/bin/env bash
# The benchmark: every figure against a floor measured in the same run, and
# one report, docs/benchmarks.md (docs/scaling.md's benchmark table summarises it).
#
#   scripts/bench.sh            # ~40 minutes on 2 cores (10 of them the chaos run)
#
# It checks Docker (starting dockerd if needed), builds the engine images from
# Debian packages if they are missing, then runs
#   1. `cargo bench --bench provision` (its state Postgres through
#      testcontainers, the controller in-process): cold sandboxes per engine
#      against bare create+start+readiness, a Postgres sandbox from a template,
#      warm pool hits, a burst of 20, heals after `docker kill` with and
#      without templates and a pool; then the realistic mix (Postgres plain,
#      pg_trgm, vector, vector+postgis; Redis plain and search) against warm
#      pools learned from demand: request to ready (p50 < 100 ms, p99 <
#      250 ms), heals after `docker kill`, `rm -f` and `stop` of every entry
#      (p50 < 0.5 s, p95 < 1 s), and a 10-minute chaos run through
#      `sandboxd chaos`'s library with rows churning and one sandbox hit
#      again and again (0 unhealed, 0 lost credentials, heal p50 < 1 s);
#      resets to a checkpoint, and an idle fleet (controller CPU, Docker
#      calls, resident memory, memory per sandbox by engine);
#   2. `cargo bench --bench fleet_sim --features simulation`: the reconciler
#      core against in-memory fakes at 10 000 and 100 000 rows (the resync
#      of a controller that starts over a converged fleet: time, resident
#      memory);
# and writes docs/benchmarks.md from both (target/bench/ keeps the parts).
# Anything a crashed run left behind is removed at the end.
# BENCH_ITERS, BENCH_BATCH_ITERS, BENCH_BATCH, BENCH_HEAL_ITERS,
# BENCH_CHAOS_SECONDS, BENCH_IDLE and BENCH_IDLE_SECONDS tune step 1 (see
# benches/provision.rs). One part of it alone, its table in
# target/bench/<part>.md and docs/benchmarks.md left as it is:
#   BENCH_ONLY=mix|mix-heals|chaos|pause|reset|fork|gvisor|swarm|seed cargo bench --bench provision
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

out=${CARGO_TARGET_DIR:-target}/bench
mkdir -p "$out"
log "running cargo bench --bench provision"
cargo bench --bench provision "$@"
log "running the fleet simulation"
cargo bench --bench fleet_sim --features simulation >"$out/fleet_sim.json"

{
  printf '# Benchmarks\n\n'
  printf 'Written by `scripts/bench.sh` on %s: %s cores, %s GiB, Docker %s (storage driver %s).\n' \
    "$(date -u +%Y-%m-%d)" "$(nproc)" "$(awk '/MemTotal/ {printf "%.0f", $2/1048576}' /proc/meminfo)" \
    "$(docker version -f '{{.Server.Version}}' 2>/dev/null)" "$(docker info -f '{{.Driver}}' 2>/dev/null)"
  printf 'Every speed is a ratio against a floor measured in the same run, so the\n'
  printf 'figures hold on a noisy machine; rerun it to check them.\n\n'
  cat "$out/provision.md"
  printf '\n## Fleet simulation\n\n'
  printf 'The reconciler core (relist, plan, queue, status decisions) against the in-memory\n'
  printf 'fakes of Docker and Postgres, every row converged: the time for the resync of a\n'
  printf 'controller that starts over the fleet (initial lists, every row planned from\n'
  printf 'them, the rows not converged reconciled); the resident memory of the process\n'
  printf 'before the resync (the fakes holding the fleet, which in production lives in\n'
  printf 'dockerd and Postgres) and at its peak; and, counted by the bench'"'"'s allocator in\n'
  printf 'a second run, the live heap of the fakes and the most heap the controller held\n'
  printf 'above it during the resync (its lists, plans and queue: what its own process\n'
  printf 'would need).\n\n'
  printf '| desired rows | resync s | left alone | reconciled | RSS before MB | RSS peak MB | fakes heap MB | controller heap MB | target |\n|---:|---:|---:|---:|---:|---:|---:|---:|---|\n'
  python3 - "$out/fleet_sim.json" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    rows, secs = r["rows"], r["resync_seconds"]
    before, hwm = r["rss_before_resync_bytes"] / 1e6, r["hwm_bytes"] / 1e6
    fakes = (r.get("heap_before_resync_bytes") or 0) / 1e6
    held = ((r.get("heap_peak_resync_bytes") or 0) - (r.get("heap_before_resync_bytes") or 0)) / 1e6
    target = ""
    if rows >= 100000:
        yes = lambda ok: "yes" if ok else "**no**"
        target = f"under 1 s: {yes(secs < 1.0)}; controller under 300 MB: {yes(held < 300)}"
    print(f"| {rows} | {secs:.3f} | {r['converged']} | {r['reconciled']} | {before:.0f} | {hwm:.0f} | {fakes:.0f} | {held:.0f} | {target} |")
PY
} >docs/benchmarks.md
log "wrote docs/benchmarks.md"
