#!/usr/bin/env bash
# Smoke test of the images built by build.sh, under the restricted profile
# sandboxd uses (all capabilities dropped but CHOWN/SETUID/SETGID,
# no-new-privileges, memory and pids limits, tmpfs data directory, port
# published on 127.0.0.1). Needs only docker: clients run inside the
# containers; the published ports are checked with bash's /dev/tcp.
# Removes every container and volume it creates.
set -euo pipefail

T0=$SECONDS
log() { printf '[smoke %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

PREFIX="sandboxd-smoke-$$"
CONTAINERS=()
VOLUMES=()
cleanup() {
	local rc=$?
	if ((${#CONTAINERS[@]})); then docker rm -f "${CONTAINERS[@]}" >/dev/null 2>&1 || :; fi
	if ((${#VOLUMES[@]})); then docker volume rm "${VOLUMES[@]}" >/dev/null 2>&1 || :; fi
	exit $rc
}
trap cleanup EXIT

PROFILE=(--cap-drop ALL --cap-add CHOWN --cap-add SETUID --cap-add SETGID
	--security-opt no-new-privileges --memory 512m --pids-limit 256)
PW="pw-$RANDOM$RANDOM-x"

start() { # NAME ARGS... -> starts a container, records it
	local name="$PREFIX-$1"
	shift
	docker run -d --name "$name" "$@" >/dev/null
	CONTAINERS+=("$name")
}
host_port() { docker port "$1" "$2" | head -n1 | sed 's/.*://'; }
# wait_log NAME PATTERN COUNT: wait until PATTERN appears COUNT times.
wait_log() {
	local i
	for ((i = 0; i < 300; i++)); do
		(($(docker logs "$1" 2>&1 | grep -c -- "$2") >= $3)) && return 0
		[[ "$(docker inspect -f '{{.State.Running}}' "$1")" == true ]] ||
			{ docker logs "$1" 2>&1 | tail -n 20 >&2; fail "$1 exited"; }
		sleep 0.1
	done
	docker logs "$1" 2>&1 | tail -n 20 >&2
	fail "$1: timed out waiting for '$2'"
}
psql_in() { # NAME USER DB SQL: password login over TCP inside the container
	docker exec -e PGPASSWORD="$PW" "$1" psql -h 127.0.0.1 -U "$2" -d "$3" -v ON_ERROR_STOP=1 -Atc "$4"
}
redis_in() { docker exec "$1" redis-cli --no-auth-warning "${@:2}"; }

# --- postgres, tmpfs --------------------------------------------------------
log "postgres:15 on tmpfs with extra args"
pg="$PREFIX-pg"
start pg "${PROFILE[@]}" --tmpfs /var/lib/postgresql/data:rw,size=256m \
	-e POSTGRES_USER=u1 -e POSTGRES_PASSWORD="$PW" -e POSTGRES_DB=d1 \
	-p 127.0.0.1::5432 sandboxd/postgres:15 -c max_connections=50
wait_log "$pg" 'ready to accept connections' 2
[[ "$(docker logs "$pg" 2>&1 | grep -c 'listening on IPv4')" == 1 ]] ||
	fail "'listening on IPv4' logged more than once (temporary server on TCP?)"
[[ "$(psql_in "$pg" u1 d1 "select current_user, current_database(), current_setting('max_connections')")" == "u1|d1|50" ]] ||
	fail "postgres login or settings"
docker exec -e PGPASSWORD=wrong "$pg" psql -h 127.0.0.1 -U u1 -d d1 -c 'select 1' >/dev/null 2>&1 &&
	fail "wrong password accepted"
docker exec "$pg" pg_isready -q || fail "pg_isready via docker exec"
port=$(host_port "$pg" 5432)
(exec 3<>"/dev/tcp/127.0.0.1/$port") || fail "published port $port not reachable"
if command -v psql >/dev/null; then
	[[ "$(psql "postgresql://u1:$PW@127.0.0.1:$port/d1" -Atc 'select 1')" == 1 ]] || fail "host psql"
fi

# --- postgres, named volume and restart -------------------------------------
log "postgres:15 on a named volume, restarted"
vol="$PREFIX-pgdata"
docker volume create "$vol" >/dev/null
VOLUMES+=("$vol")
pgv="$PREFIX-pgv"
start pgv "${PROFILE[@]}" -v "$vol:/var/lib/postgresql/data" \
	-e POSTGRES_PASSWORD="$PW" sandboxd/postgres:15
wait_log "$pgv" 'ready to accept connections' 2
psql_in "$pgv" postgres postgres 'create table t(x int); insert into t values (42)' >/dev/null
docker stop -t 30 "$pgv" >/dev/null
docker start "$pgv" >/dev/null
wait_log "$pgv" 'ready to accept connections' 3
[[ "$(psql_in "$pgv" postgres postgres 'select x from t')" == 42 ]] || fail "data lost on restart"

# --- postgres-ext -------------------------------------------------------------
log "postgres-ext:15 extensions"
pge="$PREFIX-pge"
start pge "${PROFILE[@]}" --tmpfs /var/lib/postgresql/data:rw,size=256m \
	-e POSTGRES_USER=u1 -e POSTGRES_PASSWORD="$PW" -e POSTGRES_DB=d1 sandboxd/postgres-ext:15
wait_log "$pge" 'ready to accept connections' 2
psql_in "$pge" u1 d1 'CREATE EXTENSION postgis; CREATE EXTENSION pg_trgm; CREATE EXTENSION citext; CREATE EXTENSION "uuid-ossp";' >/dev/null ||
	fail "CREATE EXTENSION"
[[ "$(psql_in "$pge" u1 d1 "select ST_AsText(ST_Point(1,2)), similarity('abc','abc'), 'A'::citext = 'a', uuid_generate_v4() is not null")" == "POINT(1 2)|1|t|t" ]] ||
	fail "extension functions"

# --- redis ----------------------------------------------------------------------
log "redis:7 without and with a password"
r="$PREFIX-redis"
start redis "${PROFILE[@]}" --tmpfs /data:rw,size=64m -p 127.0.0.1::6379 sandboxd/redis:7
wait_log "$r" 'Ready to accept connections' 1
port=$(host_port "$r" 6379)
# No config file, protected mode off: reachable through the published port.
reply=$(exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'PING\r\n' >&3 && head -c 5 <&3)
[[ "$reply" == "+PONG" ]] || fail "redis via published port: $reply"
[[ "$(redis_in "$r" SAVE)" == OK ]] || fail "redis cannot write /data"
[[ "$(docker exec "$r" stat -c %U /data/dump.rdb)" == redis ]] || fail "dump.rdb not owned by redis"

ra="$PREFIX-redis-auth"
start redis-auth "${PROFILE[@]}" --tmpfs /data:rw,size=64m sandboxd/redis:7 --requirepass "$PW" --save ''
wait_log "$ra" 'Ready to accept connections' 1
[[ "$(redis_in "$ra" PING 2>&1)" == *NOAUTH* ]] || fail "requirepass not applied"
[[ "$(redis_in "$ra" -a "$PW" CONFIG GET save | tail -n1)" == "" ]] || fail "--save '' not applied"

# --- redis-ext ------------------------------------------------------------------
log "redis-ext:7 MODULE LOAD redisearch"
re="$PREFIX-redis-ext"
start redis-ext "${PROFILE[@]}" --tmpfs /data:rw,size=64m sandboxd/redis-ext:7 \
	--requirepass "$PW" --enable-module-command yes
wait_log "$re" 'Ready to accept connections' 1
[[ "$(redis_in "$re" -a "$PW" MODULE LOAD /usr/lib/redis/modules/redisearch.so)" == OK ]] || fail "MODULE LOAD"
redis_in "$re" -a "$PW" MODULE LIST | grep -qx ft || fail "module 'ft' not listed"
redis_in "$re" -a "$PW" FT.CREATE idx SCHEMA title TEXT >/dev/null || fail "FT.CREATE"

log "all checks passed"
