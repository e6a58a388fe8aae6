# Shared shell helpers for scripts/run.sh, scripts/test.sh and .ci/run.
# Source it; every function is idempotent and needs no standard input.

log() { printf 'sandboxd: %s\n' "$*" >&2; }

# Makes sure a Docker daemon answers, starting dockerd if it does not.
ensure_docker() {
  if docker info >/dev/null 2>&1; then return 0; fi
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing Docker from Debian's packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  if docker info >/dev/null 2>&1; then return 0; fi
  log "starting dockerd"
  mkdir -p /var/log
  nohup dockerd >/var/log/sandboxd-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  log "dockerd did not answer within 60s; see /var/log/sandboxd-dockerd.log"
  return 1
}

# Builds the Debian-based engine images if they are missing.
ensure_engine_images() {
  "$(dirname "${BASH_SOURCE[0]}")/../deploy/images/build.sh"
}

# Installs Prometheus (server and promtool) from Debian's packages if missing;
# the observability tests run a real one on loopback.
ensure_prometheus() {
  if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then return 0; fi
  log "installing Prometheus from Debian's packages"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package starts a system service where it can; the tests run their own.
  (command -v service >/dev/null 2>&1 && service prometheus stop >/dev/null 2>&1) || true
}

random_password() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# start_state_db NAME PASSWORD [VOLUME]
# Starts (or reuses) a Postgres container for sandboxd's own state from the
# locally built image, published on 127.0.0.1, and prints its URL.
# With VOLUME the data persists in that named volume; without, it is tmpfs.
start_state_db() {
  local name=$1 password=$2 volume=${3:-}
  local image=${SANDBOXD_STATE_IMAGE:-sandboxd/postgres:15}
  if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != "true" ]; then
    docker rm -f "$name" >/dev/null 2>&1 || true
    local data=(--tmpfs /var/lib/postgresql/data:rw,size=512m)
    if [ -n "$volume" ]; then
      docker volume create --label io.sandboxd.state=true "$volume" >/dev/null
      data=(-v "$volume:/var/lib/postgresql/data")
    fi
    docker run -d --name "$name" --label io.sandboxd.state=true \
      --restart unless-stopped \
      -e POSTGRES_USER=sandboxd -e POSTGRES_PASSWORD="$password" -e POSTGRES_DB=sandboxd \
      "${data[@]}" -p 127.0.0.1::5432 "$image" \
      -c max_connections=300 -c fsync=off >/dev/null
  fi
  # TCP inside the container reaches only the real server, never the
  # image's temporary init server.
  for _ in $(seq 1 120); do
    if docker exec "$name" pg_isready -q -h 127.0.0.1 -U sandboxd >/dev/null 2>&1; then
      local port
      port=$(docker port "$name" 5432/tcp | head -n1 | sed 's/.*://')
      printf 'postgres://sandboxd:%s@127.0.0.1:%s/sandboxd\n' "$password" "$port"
      return 0
    fi
    sleep 0.25
  done
  log "state database $name did not become ready; docker logs $name:"
  docker logs --tail 20 "$name" >&2 || true
  return 1
}
