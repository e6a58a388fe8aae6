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

# Installs the host guard of sandbox networks (deploy/host-firewall.sh):
# without it, Docker 20.10 lets packets cross between networks for a moment
# whenever any network is created.
ensure_host_firewall() {
  if "$(dirname "${BASH_SOURCE[0]}")/../deploy/host-firewall.sh"; then return 0; fi
  log "could not install the host guard of sandbox networks (deploy/host-firewall.sh needs root and iptables)"
  return 1
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

# Installs what the two-node Swarm test's worker needs (ip, nsenter,
# unshare: tests/fixtures/swarm-worker.sh) if any is missing.
ensure_netns_tools() {
  if command -v ip >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 \
    && command -v unshare >/dev/null 2>&1; then return 0; fi
  log "installing iproute2 and util-linux from Debian's packages"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 util-linux >/dev/null
}

# Installs what the orchestrator examples (examples/, tests/integration/examples.rs) run
# with, if missing: psql (Debian's postgresql-client) and psycopg 3.2 or
# later for python3 (from PyPI; Debian's python3-psycopg where pip may not
# install into that python).
# ensure_chromium: Debian's headless-capable chromium, which the operator
# page's browser test (tests/integration/operator_page.rs) drives.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1; then return 0; fi
  log "installing chromium from Debian's packages (the operator page's browser test)"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    || { log "could not install chromium: apt-get install chromium"; return 1; }
}

# ensure_python_client: a virtual environment (target/python-client-venv)
# with the Python client's tools (pytest, mypy, setuptools, psycopg 3),
# into which it installs clients/python as a user would
# (tests/integration/python_client.rs reinstalls it from the checkout).
ensure_python_client() {
  local venv=target/python-client-venv
  if [ -x "$venv/bin/pytest" ] && [ -x "$venv/bin/mypy" ] \
     && "$venv/bin/python" -c 'import psycopg, setuptools, sandboxd' >/dev/null 2>&1; then
    return 0
  fi
  log "making $venv: pytest, mypy, setuptools and psycopg 3 from PyPI, then pip install ./clients/python"
  mkdir -p target
  python3 -m venv "$venv" \
    || { apt-get update -qq >/dev/null 2>&1 || true
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
         python3 -m venv "$venv"; } \
    || { log "cannot make a virtual environment: apt-get install python3-venv"; return 1; }
  "$venv/bin/pip" install --quiet --no-input 'psycopg[binary]>=3.2' pytest mypy 'setuptools>=77' </dev/null \
    && "$venv/bin/pip" install --quiet --no-input ./clients/python </dev/null \
    || { log "could not install the Python client's tools into $venv (above)"; return 1; }
}

ensure_example_tools() {
  if ! command -v psql >/dev/null 2>&1; then
    log "installing psql from Debian's packages (postgresql-client)"
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-client >/dev/null
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    log "installing python3 from Debian's packages"
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-pip >/dev/null
  fi
  local check="import sys, psycopg; sys.exit(tuple(int(p) for p in psycopg.__version__.split('.')[:2]) < (3, 2))"
  if python3 -c "$check" >/dev/null 2>&1; then return 0; fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null 2>&1 || true
  fi
  log "installing psycopg 3 for $(command -v python3) from PyPI"
  local pip=(python3 -m pip install --quiet --no-input --upgrade 'psycopg[binary]>=3.2')
  "${pip[@]}" </dev/null >/dev/null 2>&1 \
    || "${pip[@]}" --break-system-packages </dev/null >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 || true
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-psycopg >/dev/null 2>&1; } \
    || true
  if python3 -c "$check" >/dev/null 2>&1; then return 0; fi
  log "could not install psycopg 3.2 or later for $(command -v python3): python3 -m pip install 'psycopg[binary]>=3.2'"
  return 1
}

# ensure_runsc [install]
# Registers gVisor's runsc with dockerd as the OCI runtime `runsc`, which
# sandboxd's isolation level `gvisor` (--runtime runsc, or a row's
# isolation = 'gvisor') runs engines under. With `install` (or
# SANDBOXD_INSTALL_RUNSC=1) it first installs Debian's package `runsc` when
# the binary is missing; without, a host without runsc is left as it is.
# The runtime is registered with runtimeArgs ["--network=host"]: gVisor then
# uses the network namespace Docker made for the container (its own netstack
# cannot run in it: a plain registration fails every start with "cannot run
# with network enabled in root network namespace"). Keys already in
# /etc/docker/daemon.json are kept; dockerd reloads its runtimes on SIGHUP,
# so running containers are not touched.
ensure_runsc() {
  local install=${1:-}
  [ "${SANDBOXD_INSTALL_RUNSC:-}" = 1 ] && install=install
  if ! command -v runsc >/dev/null 2>&1; then
    [ "$install" = install ] || return 0
    log "installing gVisor (runsc) from Debian's packages"
    apt-get update -qq >/dev/null 2>&1 || true
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null; then
      log "could not install runsc (apt-get install runsc); sandboxes that ask for isolation gvisor will fail"
      return 1
    fi
  fi
  local runsc runtimes
  runsc=$(command -v runsc)
  runtimes=$(docker info --format '{{json .Runtimes}}' 2>/dev/null || true)
  if printf '%s' "$runtimes" | grep -q '"runsc":{[^}]*--network=host'; then return 0; fi
  local conf=${SANDBOXD_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
  log "registering gVisor ($runsc) with dockerd as the runtime runsc in $conf"
  mkdir -p "$(dirname "$conf")"
  if ! python3 - "$conf" "$runsc" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
conf = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        conf = json.load(f)
conf.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": ["--network=host"]}
tmp = path + ".sandboxd-new"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
PY
  then
    log "could not write $conf (needs root and python3)"
    return 1
  fi
  # The daemon behind the default socket: its pid file (a test's second
  # dockerd, such as the Swarm worker's, has its own), else the only one.
  local pid=
  [ -s /var/run/docker.pid ] && pid=$(cat /var/run/docker.pid)
  if [ -z "$pid" ] && [ "$(pidof dockerd | wc -w)" = 1 ]; then pid=$(pidof dockerd); fi
  if [ -z "$pid" ]; then
    log "cannot tell which dockerd to reload: send it SIGHUP (it rereads $conf), or restart it"
    return 1
  fi
  # Reloads the runtimes (and other reloadable keys); no restart.
  kill -HUP "$pid"
  for _ in $(seq 1 20); do
    if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc":{[^}]*--network=host'; then
      return 0
    fi
    sleep 0.5
  done
  log "dockerd does not list the runtime runsc after reloading $conf; see its log"
  return 1
}

random_password() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# start_state_db NAME PASSWORD [VOLUME]
# Starts (or reuses) a Postgres container for sandboxd's own state from the
# locally built image, published on 127.0.0.1, and prints the URL of the role
# `sandboxd`: an ordinary role (no superuser, CREATEROLE or CREATEDB) that
# owns the database `sandboxd` and has PASSWORD (alphanumeric). The cluster's
# superuser `postgres` gets a random password that is not kept: it is reached
# only over the container's local socket,
#   docker exec -it NAME psql -U postgres -d sandboxd
# which is where orchestrator roles are created (docs/contract.md, "Roles").
# With VOLUME the data persists in that named volume with fsync on (the
# desired rows must survive a crash of the host: a state database that
# comes back empty or older reads as "every sandbox deleted"); without, it
# is a throwaway tmpfs with fsync off.
# A volume holds the cluster of one PostgreSQL major version: one initialised
# by an earlier default image (sandboxd/postgres:15) cannot be opened by
# sandboxd/postgres:17, which is refused here with what to do.
start_state_db() {
  local name=$1 password=$2 volume=${3:-}
  local image=${SANDBOXD_STATE_IMAGE:-sandboxd/postgres:17}
  case $password in
    '' | *[!A-Za-z0-9]*)
      log "start_state_db: the password must be alphanumeric (it goes into a URL and into SQL)"
      return 1 ;;
  esac
  if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != "true" ]; then
    docker rm -f "$name" >/dev/null 2>&1 || true
    local data=(--tmpfs /var/lib/postgresql/data:rw,size=512m) durability=(-c fsync=off)
    if [ -n "$volume" ]; then
      docker volume create --label io.sandboxd.state=true "$volume" >/dev/null
      data=(-v "$volume:/var/lib/postgresql/data")
      durability=(-c fsync=on)
      local have want
      have=$(docker run --rm --entrypoint cat -v "$volume:/var/lib/postgresql/data" "$image" \
        /var/lib/postgresql/data/PG_VERSION 2>/dev/null || true)
      want=$(docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$image" 2>/dev/null |
        sed -n 's/^PG_MAJOR=//p')
      if [ -n "$have" ] && [ -n "$want" ] && [ "$have" != "$want" ]; then
        log "the state volume $volume holds a PostgreSQL $have cluster, which $image (PostgreSQL $want) cannot open."
        log "  Either keep using a PostgreSQL $have image (SANDBOXD_STATE_IMAGE=...), or move what you keep:"
        log "  start it with such an image, docker exec $name pg_dump -U sandboxd --data-only -t sandbox_desired sandboxd >desired.sql,"
        log "  docker rm -f $name && docker volume rm $volume, start again (sandboxd migrates the new database),"
        log "  then docker exec -i $name psql -U sandboxd -d sandboxd <desired.sql (orchestrator roles are created again, docs/contract.md, \"Roles\")."
        return 1
      fi
    fi
    docker run -d --name "$name" --label io.sandboxd.state=true \
      --restart unless-stopped \
      -e POSTGRES_USER=postgres -e POSTGRES_PASSWORD="$(random_password)" \
      "${data[@]}" -p 127.0.0.1::5432 "$image" \
      -c max_connections=300 "${durability[@]}" >/dev/null
  elif [ -n "$volume" ] && docker inspect -f '{{join .Args " "}}' "$name" 2>/dev/null | grep -q 'fsync=off'; then
    # Started by an earlier version of this script, which turned fsync off.
    log "WARNING: the running state database $name has fsync off: a crash of the host can lose desired rows."
    log "  To turn it on, recreate the container (the volume $volume keeps the data): docker rm -f $name, then start again."
  fi
  # TCP inside the container reaches only the real server, never the
  # image's temporary init server.
  local ready=
  for _ in $(seq 1 120); do
    if docker exec "$name" pg_isready -q -h 127.0.0.1 >/dev/null 2>&1; then ready=1; break; fi
    sleep 0.25
  done
  if [ -z "$ready" ]; then
    log "state database $name did not become ready; docker logs $name:"
    docker logs --tail 20 "$name" >&2 || true
    return 1
  fi
  if ! docker exec "$name" psql -XqAt -U postgres -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
    # A volume initialised before sandboxd ran as an ordinary role: there,
    # `sandboxd` is the cluster's superuser and no `postgres` role exists.
    if [ "$(docker exec "$name" psql -XqAt -U sandboxd -d sandboxd \
           -c 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user' 2>/dev/null)" = t ]; then
      log "WARNING: the state database in $name${volume:+ (volume $volume)} has sandboxd as its superuser"
      log "  (it predates the ordinary controller role), so sandboxd keeps running as a superuser."
      log "  To move: dump what you keep (docker exec $name pg_dump -U sandboxd --data-only -t sandbox_desired sandboxd),"
      log "  then docker rm -f $name${volume:+ && docker volume rm $volume}, start again, and restore the rows."
    else
      log "cannot reach the superuser postgres in $name over its local socket: docker exec $name psql -U postgres"
      return 1
    fi
  else
    # Idempotent: the role (with the password given) and its database.
    docker exec -i "$name" psql -Xq -v ON_ERROR_STOP=1 -U postgres -d postgres >/dev/null <<SQL || return 1
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sandboxd') THEN
    CREATE ROLE sandboxd;
  END IF;
END
\$\$;
ALTER ROLE sandboxd WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '$password';
SELECT 'CREATE DATABASE sandboxd OWNER sandboxd'
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'sandboxd') \gexec
SQL
  fi
  local port
  port=$(docker port "$name" 5432/tcp | head -n1 | sed 's/.*://')
  printf 'postgres://sandboxd:%s@127.0.0.1:%s/sandboxd\n' "$password" "$port"
}

# ensure_swarm_manager
# Makes sure this Docker engine is a manager of a Swarm (sandboxd's Swarm
# backend talks to a manager). On an engine in no Swarm, with
# SANDBOXD_SWARM_INIT=1, makes it a single-node Swarm advertising
# SANDBOXD_SWARM_ADVERTISE_ADDR (default 127.0.0.1), after creating the
# node's gateway bridge closed (no masquerading, no traffic between its
# containers; Docker would otherwise create an open one at `swarm init`):
# a task on it (one that publishes a port, or whose overlay has egress)
# then reaches neither the outside nor other tasks. Otherwise refuses, saying
# what to run.
ensure_swarm_manager() {
  local state
  state=$(docker info --format '{{.Swarm.LocalNodeState}}')
  if [ "$state" != active ]; then
    if [ "${SANDBOXD_SWARM_INIT:-}" != 1 ]; then
      log "--backend swarm: this Docker engine is in no Swarm (state: ${state:-unknown})."
      log "  Make it a single-node Swarm: SANDBOXD_BACKEND=swarm SANDBOXD_SWARM_INIT=1 scripts/run.sh"
      log "  or join one as a manager first (docker swarm join --token MANAGER-TOKEN ADDR)."
      return 1
    fi
    if ! docker network inspect docker_gwbridge >/dev/null 2>&1; then
      docker network create --driver bridge \
        --opt com.docker.network.bridge.name=docker_gwbridge \
        --opt com.docker.network.bridge.enable_ip_masquerade=false \
        --opt com.docker.network.bridge.enable_icc=false docker_gwbridge >/dev/null
    fi
    local addr=${SANDBOXD_SWARM_ADVERTISE_ADDR:-127.0.0.1}
    log "making this engine a single-node Swarm (docker swarm init --advertise-addr $addr; undo: docker swarm leave --force)"
    docker swarm init --advertise-addr "$addr" >/dev/null
  fi
  if [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" != true ]; then
    log "--backend swarm: this engine is a Swarm worker; sandboxd talks to a manager: run it on a manager node"
    return 1
  fi
}

# build_controller_image BINARY
# Builds sandboxd/controller:local, BINARY on the engine images' base
# (deploy/controller.Dockerfile), unless it holds BINARY already (label
# io.sandboxd.binary, its SHA-256). Under Swarm it is also the image of the
# helper that runs commands in engines on other nodes
# (--swarm-helper-image): copy it to every node as the engine images.
build_controller_image() {
  local binary=$1 root image=sandboxd/controller:local sum context
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  sum=$(sha256sum "$binary" | cut -d' ' -f1)
  if [ "$(docker image inspect -f '{{index .Config.Labels "io.sandboxd.binary"}}' "$image" 2>/dev/null)" = "$sum" ]; then
    return 0
  fi
  log "building $image from $binary"
  context=$(mktemp -d)
  cp "$binary" "$context/sandboxd"
  local built=0 output
  output=$(docker build -q --label "io.sandboxd.binary=$sum" -t "$image" \
    -f "$root/deploy/controller.Dockerfile" "$context" 2>&1) || built=$?
  rm -rf "$context"
  if [ "$built" -ne 0 ]; then
    log "building $image failed:"
    printf '%s\n' "$output" >&2
    return 1
  fi
}

# run_controller_container BINARY NAME STATE_CONTAINER [ARGS...]
# (STATE_CONTAINER empty: DATABASE_URL is the operator's own, and must be
# reachable from a container on the bridge network sandboxd-control.)
# Runs `sandboxd run ARGS` in the foreground in a container NAME, as the
# Swarm backend wants it: attached to every sandbox's overlay, which stays
# internal, and probing engines by name there (--probe-via network), so no
# engine port is published on any node. The image (sandboxd/controller:local)
# is BINARY on the engine images' base (deploy/controller.Dockerfile), built
# again when BINARY changes. The container reaches the state database
# STATE_CONTAINER (started by start_state_db) on a bridge network of their
# own (sandboxd-control) and Docker by its socket; /metrics, /healthz and
# /readyz are served on its address on that network only (not on the
# overlays, where agents are) and published on the host at
# SANDBOXD_METRICS_ADDR (default 127.0.0.1:9187). Every SANDBOXD_* variable
# set here is passed on. DATABASE_URL must be the state container's URL
# (the container reads it from a file, below).
run_controller_container() {
  local binary=$1 name=$2 state=$3
  shift 3
  local image=sandboxd/controller:local
  build_controller_image "$binary" || return 1
  if [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; then
    log "a controller container $name runs already: stop it first (docker stop $name), or name another with SANDBOXD_CONTROLLER_CONTAINER"
    return 1
  fi
  docker rm -f "$name" >/dev/null 2>&1 || true
  local network=sandboxd-control
  docker network inspect "$network" >/dev/null 2>&1 ||
    docker network create --label io.sandboxd.control=true "$network" >/dev/null
  if [ -n "$state" ] &&
    ! docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "$state" | grep -qw "$network"; then
    docker network connect "$network" "$state"
  fi
  # The URL as the container sees it (the state container by name), in a
  # file of the container's user, mode 0600, mounted as its SANDBOXD_HOME:
  # never in its environment, which `docker inspect` shows.
  local home=${SANDBOXD_HOME:-${HOME:-/root}/.local/state/sandboxd}/controller user=10001:10001
  mkdir -p "$home" && chmod 700 "$home"
  local url=$DATABASE_URL
  if [ -n "$state" ]; then url=$(printf '%s' "$url" | sed -E "s#@[^/]+/#@$state:5432/#"); fi
  (umask 077 && printf '%s\n' "$url" >"$home/database-url")
  if [ "$(id -u)" = 0 ]; then
    chown -R "$user" "$home"
  else
    user="$(id -u):$(id -g)"
  fi
  # --metrics-addr among the arguments is where the host reaches them.
  local metrics=${SANDBOXD_METRICS_ADDR:-127.0.0.1:9187} args=()
  while [ $# -gt 0 ]; do
    case $1 in
      --metrics-addr) metrics=$2; shift 2 ;;
      --metrics-addr=*) metrics=${1#*=}; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  local pass=() var
  for var in $(compgen -e | grep '^SANDBOXD_' || true); do
    case $var in
      SANDBOXD_METRICS_ADDR | SANDBOXD_IMAGE_BUILD_COMMAND | SANDBOXD_BIN | SANDBOXD_HOME | SANDBOXD_PROBE_VIA | SANDBOXD_CONTROLLER_CONTAINER) ;;
      *) pass+=(--env "$var") ;;
    esac
  done
  log "running sandboxd in the container $name (docker logs $name; metrics at $metrics)"
  exec docker run --rm --name "$name" --init \
    --network "$network" -p "$metrics:9187" \
    -v /var/run/docker.sock:/var/run/docker.sock \
    --group-add "$(stat -c %g /var/run/docker.sock)" \
    --user "$user" --read-only --cap-drop ALL --security-opt no-new-privileges \
    -v "$home:/run/sandboxd:ro" --env SANDBOXD_HOME=/run/sandboxd \
    "${pass[@]}" \
    --env SANDBOXD_PROBE_VIA=network --env "SANDBOXD_CONTROLLER_CONTAINER=$name" \
    --entrypoint sh "$image" -c \
    'exec sandboxd run --metrics-addr "$(hostname -i | cut -d" " -f1):9187" "$@"' sandboxd "${args[@]}"
}
