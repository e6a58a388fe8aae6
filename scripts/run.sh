#!/usr/bin/env bash
# Starts sandboxd on this machine. Needs only Docker (and this repository):
#   - checks the Docker daemon answers (starting dockerd if not);
#   - without DATABASE_URL, runs its own state Postgres as a labelled
#     container with the volume `sandboxd-state` (password kept in
#     ${SANDBOXD_HOME:-~/.local/state/sandboxd}/state-password);
#   - uses the engine images already present (upstream, else the
#     Debian-built ones), else pulls the upstream ones, else builds
#     Debian-based ones (deploy/images/build.sh) and uses those;
#   - builds and runs `sandboxd run` (metrics on 127.0.0.1:9187).
# Extra arguments go to `sandboxd run`; every flag has a SANDBOXD_* variable.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_docker

use_debian_images() {
  export SANDBOXD_IMAGES=postgres=sandboxd/postgres:15,redis=sandboxd/redis:7,valkey=sandboxd/valkey:8
  # Should an image vanish later, sandboxd rebuilds it.
  export SANDBOXD_IMAGE_BUILD_COMMAND=${SANDBOXD_IMAGE_BUILD_COMMAND:-$PWD/deploy/images/build.sh}
  export SANDBOXD_FEATURES_IMAGES=${SANDBOXD_FEATURES_IMAGES:-postgres=sandboxd/postgres-ext:15,redis=sandboxd/redis-ext:7}
}
if [ -z "${SANDBOXD_IMAGES:-}" ]; then
  # Prefer what is already here; pull only when nothing is; build last.
  if docker image inspect postgres:16-alpine redis:8-alpine >/dev/null 2>&1; then
    log "using upstream engine images"
  elif docker image inspect sandboxd/postgres:15 sandboxd/redis:7 >/dev/null 2>&1; then
    log "using the Debian-built engine images already present"
    use_debian_images
  elif timeout 60 docker pull -q postgres:16-alpine >/dev/null 2>&1 \
       && timeout 60 docker pull -q redis:8-alpine >/dev/null 2>&1; then
    log "pulled upstream engine images"
  else
    log "upstream images cannot be pulled; building engine images from Debian packages"
    ensure_engine_images
    use_debian_images
  fi
fi

if [ -z "${DATABASE_URL:-}" ]; then
  home=${SANDBOXD_HOME:-${HOME:-/root}/.local/state/sandboxd}
  mkdir -p "$home" && chmod 700 "$home"
  if [ ! -s "$home/state-password" ]; then random_password >"$home/state-password"; fi
  ensure_engine_images
  DATABASE_URL=$(start_state_db sandboxd-state "$(cat "$home/state-password")" sandboxd-state)
  export DATABASE_URL
  log "state database: container sandboxd-state (volume sandboxd-state)"
fi

cargo build --release --quiet
exec target/release/sandboxd run "$@"
