#!/usr/bin/env bash
# Starts sandboxd on this machine. Needs only Docker (and this repository):
#   - checks the Docker daemon answers (starting dockerd if not);
#   - installs the host guard of sandbox networks (deploy/host-firewall.sh);
#   - registers gVisor with dockerd as the runtime runsc when runsc is
#     installed (installing Debian's package first with
#     SANDBOXD_INSTALL_RUNSC=1 or SANDBOXD_RUNTIME=runsc), for
#     --runtime runsc and rows that ask for isolation 'gvisor';
#   - without DATABASE_URL, runs its own state Postgres as a labelled
#     container with the volume `sandboxd-state` (fsync on); sandboxd connects as the
#     ordinary role `sandboxd` that owns the database `sandboxd` (password
#     kept in ${SANDBOXD_HOME:-~/.local/state/sandboxd}/state-password, and
#     the URL, which the CLI then uses by default, in database-url); the
#     superuser `postgres` has no kept password and is reached only with
#     `docker exec -it sandboxd-state psql -U postgres -d sandboxd`;
#   - builds the engine images from Debian packages when they are missing or
#     their sources changed (deploy/images/build.sh), unless SANDBOXD_IMAGES
#     names others (they must speak sandbox mode);
#   - builds and runs `sandboxd run` (metrics on 127.0.0.1:9187), or runs
#     the binary SANDBOXD_BIN names without building.
# With SANDBOXD_BACKEND=swarm (docs/swarm.md, "Starting it"):
#   - the engine must be a Swarm manager; SANDBOXD_SWARM_INIT=1 makes an
#     engine in no Swarm a single-node one (its gateway bridge closed);
#   - sandboxd runs in a container (SANDBOXD_CONTROLLER_CONTAINER, default
#     sandboxd-controller) attached to every sandbox's overlay, probing
#     engines there: nothing is published on any node (unless
#     SANDBOXD_SWARM_PUBLISH=host, which keeps sandboxd on the host);
#   - the same warm pool as on one host, of pool services.
# Extra arguments go to `sandboxd run`; every flag has a SANDBOXD_* variable.
# SANDBOXD_STATE_CONTAINER names the state database's container and volume
# (default sandboxd-state), for a second one beside the first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_docker
swarm=
if [ "${SANDBOXD_BACKEND:-docker}" = swarm ]; then
  ensure_swarm_manager
  if [ "${SANDBOXD_SWARM_PUBLISH:-none}" = none ]; then swarm=container; else swarm=host; fi
fi
ensure_host_firewall || log "WARNING: sandboxes are isolated only by Docker's own rules, which lapse whenever a network is created; run deploy/host-firewall.sh as root"
if [ "${SANDBOXD_RUNTIME:-}" = runsc ]; then
  ensure_runsc install
else
  ensure_runsc || log "WARNING: gVisor is not registered with dockerd: sandboxes that ask for isolation 'gvisor' fail until it is (SANDBOXD_INSTALL_RUNSC=1 scripts/run.sh)"
fi

# The engine images must speak sandbox mode (secrets on stdin, least
# privilege): build (or refresh, when their sources changed) the Debian-based
# ones, which are sandboxd's defaults. Should one vanish later, sandboxd
# rebuilds it.
if [ -z "${SANDBOXD_IMAGES:-}" ]; then
  ensure_engine_images
  export SANDBOXD_IMAGE_BUILD_COMMAND=${SANDBOXD_IMAGE_BUILD_COMMAND:-$PWD/deploy/images/build.sh}
fi

state=
if [ -z "${DATABASE_URL:-}" ]; then
  home=${SANDBOXD_HOME:-${HOME:-/root}/.local/state/sandboxd}
  mkdir -p "$home" && chmod 700 "$home"
  if [ ! -s "$home/state-password" ]; then random_password >"$home/state-password"; fi
  ensure_engine_images
  state=${SANDBOXD_STATE_CONTAINER:-sandboxd-state}
  DATABASE_URL=$(start_state_db "$state" "$(cat "$home/state-password")" "$state")
  export DATABASE_URL
  # The CLI reads it from here when neither --database-url nor
  # DATABASE_URL is given (its port is whatever Docker published).
  (umask 077 && printf '%s\n' "$DATABASE_URL" >"$home/database-url.new" \
    && mv -f "$home/database-url.new" "$home/database-url")
  log "state database: container $state (volume $state), role sandboxd;"
  log "  its URL: $home/database-url (mode 0600), which the CLI uses by default (sandboxd -v says so)"
  log "  superuser: docker exec -it $state psql -U postgres -d sandboxd"
fi

# A small warm pool: new sandboxes are served by claiming a ready container
# (under Swarm, a ready service); set SANDBOXD_WARM_POOL= to turn it off.
export SANDBOXD_WARM_POOL=${SANDBOXD_WARM_POOL-postgres=2 redis=2}

bin=${SANDBOXD_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=target/release/sandboxd
fi
if [ "$swarm" = container ]; then
  run_controller_container "$bin" "${SANDBOXD_CONTROLLER_CONTAINER:-sandboxd-controller}" "$state" "$@"
fi
exec "$bin" run "$@"
