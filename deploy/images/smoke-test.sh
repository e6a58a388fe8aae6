#!/usr/bin/env bash
# Smoke test of the images built by build.sh.
#
# Plain mode, under the restricted profile (all capabilities dropped but
# CHOWN/SETUID/SETGID, no-new-privileges, memory and pids limits, tmpfs data
# directory, port published on 127.0.0.1), started as root as before.
#
# Sandbox mode (SANDBOXD_SANDBOX=1, see README.md), the way the controller
# starts it: --user 999:999 --read-only --cap-drop ALL, no-new-privileges,
# noexec tmpfs mounts owned by 999, the password written to `docker run -i`'s
# standard input; then the least-privilege checks (postgres: no superuser,
# no COPY TO PROGRAM, trusted extensions and CREATE DATABASE work, features
# created, superuser refused over TCP; redis/valkey: admin commands refused,
# data commands work, modules only from the arguments), the input errors
# (exit 64/65), and that the password shows in no `docker inspect`, `docker
# logs`, process argv or environment in the container, nor host `ps`.
#
# Needs only docker: clients run inside the containers (the password reaches
# them on their standard input, never in argv); the published ports are
# checked with bash's /dev/tcp. Removes every container and volume it creates.
set -euo pipefail

T0=$SECONDS
log() { printf '[smoke %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

PREFIX="sandboxd-smoke-$$"
CONTAINERS=()
VOLUMES=()
TMPD=$(mktemp -d /tmp/sandboxd-smoke.XXXXXX)
cleanup() {
	local rc=$?
	rm -rf "$TMPD"
	if ((${#CONTAINERS[@]})); then docker rm -f "${CONTAINERS[@]}" >/dev/null 2>&1 || :; fi
	if ((${#VOLUMES[@]})); then docker volume rm "${VOLUMES[@]}" >/dev/null 2>&1 || :; fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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

# --- sandbox mode helpers ----------------------------------------------------
# The password is only ever written by the printf builtin to a pipe.
SPW="Sbx$(printf '%04x' "$RANDOM" "$RANDOM" "$RANDOM" "$RANDOM")Pw" # [A-Za-z0-9]{21}
SB=(--user 999:999 --read-only --cap-drop ALL --security-opt no-new-privileges
	--memory 512m --pids-limit 256 -e SANDBOXD_SANDBOX=1)
sb_tmpfs() { # PATH [SIZE]: the tmpfs options the controller uses
	printf -- '--tmpfs\n%s:rw,noexec,nosuid,nodev,%suid=999,gid=999\n' "$1" "${2:+size=$2,}"
}
mapfile -t SB_PG < <(sb_tmpfs /var/lib/postgresql/data 256m; sb_tmpfs /var/run/postgresql; sb_tmpfs /tmp)
mapfile -t SB_REDIS < <(sb_tmpfs /data 64m; sb_tmpfs /run/sandboxd; sb_tmpfs /tmp)
# start_sb NAME ARGS...: `docker run -i`, the password on stdin, then EOF.
start_sb() {
	local name="$PREFIX-$1" i
	shift
	CONTAINERS+=("$name")
	docker run -i --name "$name" "$@" < <(printf 'SANDBOXD_PASSWORD=%s\n' "$SPW") >/dev/null 2>&1 &
	for ((i = 0; i < 100; i++)); do
		docker inspect "$name" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	fail "$name was not created"
}
# expect_exit CODE PATTERN INPUT ARGS...: a --rm sandbox container given INPUT
# (printf %b) on stdin exits with CODE and prints PATTERN (fixed string).
expect_exit() {
	local code=$1 pattern=$2 input=$3 out rc
	shift 3
	out=$(docker run --rm -i "$@" < <(printf '%b' "$input") 2>&1) && rc=0 || rc=$?
	[[ $rc == "$code" && $out == *"$pattern"* ]] ||
		{ printf '%s\n' "$out" | tail -n 5 >&2; fail "expected exit $code and '$pattern', got exit $rc"; }
	printf '%s\n' "$out" | no_leak "the output of a failed start"
}
# no_leak WHAT: fail if stdin holds the password (read from a pipe, not argv).
no_leak() {
	if grep -qF -f <(printf '%s\n' "$SPW"); then fail "$1 shows the password"; fi
}
check_no_leak() { # NAME
	docker inspect "$1" | no_leak "docker inspect $1"
	docker logs "$1" 2>&1 | no_leak "docker logs $1"
	docker exec "$1" sh -c 'for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do tr "\0" "\n" <"$f"; echo; done 2>/dev/null' |
		no_leak "a process's argv or environment in $1"
	ps -eo args | no_leak "host ps"
}
# psql_sb NAME USER DB SQL...: password login over TCP inside the container;
# the password goes to psql's environment through the shell's read builtin.
psql_sb() {
	local c=$1 u=$2 d=$3
	shift 3
	local -a sql=()
	local s
	for s in "$@"; do sql+=(-c "$s"); done
	docker exec -i "$c" bash -c 'read -r PGPASSWORD; export PGPASSWORD; exec psql -h 127.0.0.1 -X -v ON_ERROR_STOP=1 -v VERBOSITY=sqlstate -At "$@"' \
		psql -U "$u" -d "$d" "${sql[@]}" <<<"$SPW"
}
# cli_sb NAME CLI ARGS...: redis-cli/valkey-cli authenticated with the
# password (REDISCLI_AUTH, which valkey-cli reads too), at most $CLI_TIMEOUT s.
CLI_TIMEOUT=10
cli_sb() {
	local c=$1
	shift
	docker exec -i "$c" sh -c 'read -r REDISCLI_AUTH; export REDISCLI_AUTH; exec timeout "$0" "$@"' \
		"$CLI_TIMEOUT" "$@" <<<"$SPW"
}

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

# --- valkey ---------------------------------------------------------------------
log "valkey:8 without a password"
v="$PREFIX-valkey"
start valkey "${PROFILE[@]}" --tmpfs /data:rw,size=64m sandboxd/valkey:8
wait_log "$v" 'Ready to accept connections' 1
[[ "$(docker exec "$v" valkey-cli SAVE)" == OK ]] || fail "valkey cannot write /data"
[[ "$(docker exec "$v" stat -c %U /data/dump.rdb)" == valkey ]] || fail "dump.rdb not owned by valkey"

# === sandbox mode ================================================================
# --- postgres ----------------------------------------------------------------------
log "postgres:15 sandbox mode"
sp="$PREFIX-sb-pg"
start_sb sb-pg "${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=hstore,citext -p 127.0.0.1::5432 \
	sandboxd/postgres:15 -c fsync=off -c synchronous_commit=off -c full_page_writes=off
wait_log "$sp" 'ready to accept connections' 2
[[ "$(docker logs "$sp" 2>&1 | grep -c 'listening on IPv4')" == 1 ]] ||
	fail "'listening on IPv4' logged more than once (temporary server on TCP?)"
[[ "$(psql_sb "$sp" sandbox sandbox "select current_user, current_database(), current_setting('fsync'), current_setting('full_page_writes')")" == "sandbox|sandbox|off|off" ]] ||
	fail "sandbox login or settings"
[[ "$(psql_sb "$sp" sandbox sandbox "select rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls from pg_roles where rolname = current_user")" == "f|t|f|f|f" ]] ||
	fail "sandbox role attributes"
[[ "$(psql_sb "$sp" sandbox sandbox "select count(*) from unnest(array['pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files', 'pg_read_all_data', 'pg_write_all_data']) r where pg_has_role(current_user, r, 'member')")" == 0 ]] ||
	fail "sandbox role is a member of a pg_*_server_* or pg_*_all_data role"
out=$(psql_sb "$sp" sandbox sandbox "COPY (SELECT 1) TO PROGRAM 'id'" 2>&1) && fail "COPY TO PROGRAM allowed: $out"
[[ $out == *42501* ]] || fail "COPY TO PROGRAM: expected SQLSTATE 42501, got: $out"
[[ "$(psql_sb "$sp" sandbox sandbox "select string_agg(extname, ',' order by extname) from pg_extension")" == "citext,hstore,plpgsql" ]] ||
	fail "SANDBOXD_FEATURES not created"
[[ "$(psql_sb "$sp" sandbox sandbox "select nspowner::regrole from pg_namespace where nspname = 'public'")" == sandbox ]] ||
	fail "schema public not owned by the sandbox role"
psql_sb "$sp" sandbox sandbox 'CREATE DATABASE x' >/dev/null || fail "CREATE DATABASE"
[[ "$(psql_sb "$sp" sandbox x 'CREATE EXTENSION pg_trgm' "select similarity('abc', 'abc')")" == *1 ]] ||
	fail "CREATE EXTENSION pg_trgm (trusted) as the sandbox role"
out=$(psql_sb "$sp" postgres postgres 'select 1' 2>&1) && fail "superuser logged in over TCP"
[[ $out == *"pg_hba.conf rejects connection"* ]] || fail "superuser over TCP: $out"
out=$(psql_sb "$sp" sandbox postgres 'select 1' 2>&1) && fail "sandbox role connected to database postgres"
[[ $out == *"permission denied for database"* ]] || fail "database postgres: $out"
docker exec -i "$sp" bash -c 'PGPASSWORD=wrongwrongwrong psql -h 127.0.0.1 -U sandbox -d sandbox -c "select 1"' >/dev/null 2>&1 &&
	fail "wrong password accepted"
docker exec "$sp" pg_isready -q || fail "pg_isready via docker exec"
port=$(host_port "$sp" 5432)
(exec 3<>"/dev/tcp/127.0.0.1/$port") || fail "published port $port not reachable"
check_no_leak "$sp"

log "postgres-ext:15 sandbox mode with postgis"
spe="$PREFIX-sb-pge"
start_sb sb-pge "${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=postgis,uuid-ossp \
	-e SANDBOXD_USER=agent -e SANDBOXD_DATABASE=app sandboxd/postgres-ext:15
wait_log "$spe" 'ready to accept connections' 2
[[ "$(psql_sb "$spe" agent app "select rolsuper from pg_roles where rolname = current_user" "select ST_AsText(ST_Point(1,2)), uuid_generate_v4() is not null")" == $'f\nPOINT(1 2)|t' ]] ||
	fail "postgis feature"
check_no_leak "$spe"

log "postgres:15 sandbox mode input errors"
pw_line="SANDBOXD_PASSWORD=$SPW\n"
expect_exit 64 'no SANDBOXD_PASSWORD on standard input' '' "${SB[@]}" "${SB_PG[@]}" sandboxd/postgres:15
expect_exit 64 'unknown key SANDBOXD_PASSWD on standard input (allowed keys: SANDBOXD_PASSWORD)' \
	"SANDBOXD_PASSWD=$SPW\n$pw_line" "${SB[@]}" "${SB_PG[@]}" sandboxd/postgres:15
expect_exit 64 'must be 16 to 128 characters' "SANDBOXD_PASSWORD=short\n" "${SB[@]}" "${SB_PG[@]}" sandboxd/postgres:15
expect_exit 64 'SANDBOXD_FEATURES must be' "$pw_line" "${SB[@]}" "${SB_PG[@]}" -e 'SANDBOXD_FEATURES=x;y' sandboxd/postgres:15
expect_exit 64 'never runs as root' "$pw_line" --user 0:0 -e SANDBOXD_SANDBOX=1 sandboxd/postgres:15
expect_exit 65 'feature "postgis" is not available in this image: ' "$pw_line" \
	"${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=pg_trgm,postgis sandboxd/postgres:15

# --- redis, redis-ext, valkey ------------------------------------------------------
# check_kv NAME CLI: the sandbox ACL and config, as the agent sees them.
check_kv() {
	local c=$1 cli=$2 out cmd
	[[ "$(docker exec "$c" "$cli" PING 2>&1)" == *NOAUTH* ]] || fail "$c: no password needed"
	[[ "$(docker exec "$c" stat -c '%a %u' /run/sandboxd/server.conf)" == "600 999" ]] || fail "$c: server.conf mode"
	for cmd in "PING:PONG" "SET k v:OK" "GET k:v" "FLUSHDB:OK" "FLUSHALL:OK" "EVAL:1" "PUBLISH ch x:0" \
		"CONFIG GET save:save"; do
		if [[ ${cmd%%:*} == EVAL ]]; then
			out=$(cli_sb "$c" "$cli" EVAL 'return 1' 0 2>&1)
		else
			# shellcheck disable=SC2086 # split on purpose
			out=$(cli_sb "$c" "$cli" ${cmd%%:*} 2>&1)
		fi
		[[ ${out%%$'\n'*} == "${cmd#*:}" ]] || fail "$c: ${cmd%%:*}: $out"
	done
	for cmd in "CONFIG SET maxmemory 1" "MODULE LOAD /usr/lib/redis/modules/redisearch.so" \
		"REPLICAOF 127.0.0.1 6380" "SLAVEOF 127.0.0.1 6380" "DEBUG SLEEP 0" "SHUTDOWN NOSAVE" \
		"ACL SETUSER x on" "SAVE" "BGSAVE" "BGREWRITEAOF" "MONITOR" "FAILOVER"; do
		# shellcheck disable=SC2086
		out=$(cli_sb "$c" "$cli" $cmd 2>&1)
		[[ $out == NOPERM* || $out == "ERR "*"command not allowed"* ]] || fail "$c: $cmd not refused: $out"
	done
	# SUBSCRIBE/PUBLISH round trip; CLIENT KILL ends the subscriber.
	cli_sb "$c" "$cli" SUBSCRIBE ch1 >"$TMPD/sub" 2>&1 &
	local sub=$! i
	for ((i = 0; i < 50; i++)); do
		[[ "$(cli_sb "$c" "$cli" PUBSUB NUMSUB ch1 | tail -n1)" == 1 ]] && break
		sleep 0.1
	done
	[[ "$(cli_sb "$c" "$cli" PUBLISH ch1 hello)" == 1 ]] || fail "$c: PUBLISH reached no subscriber"
	for ((i = 0; i < 50; i++)); do
		grep -qx hello "$TMPD/sub" && break
		sleep 0.1
	done
	cli_sb "$c" "$cli" CLIENT KILL TYPE pubsub >/dev/null
	wait "$sub" || :
	grep -qx hello "$TMPD/sub" || fail "$c: SUBSCRIBE got: $(cat "$TMPD/sub")"
	[[ "$(docker exec "$c" sh -c 'ls /data | wc -l')" == 0 ]] || fail "$c: something was saved to /data"
	check_no_leak "$c"
}

log "redis:7 sandbox mode"
sr="$PREFIX-sb-redis"
start_sb sb-redis "${SB[@]}" "${SB_REDIS[@]}" sandboxd/redis:7
wait_log "$sr" 'Ready to accept connections' 1
check_kv "$sr" redis-cli
[[ -z "$(cli_sb "$sr" redis-cli MODULE LIST)" ]] || fail "$sr: a module is loaded"

log "redis-ext:7 sandbox mode with --loadmodule redisearch"
sre="$PREFIX-sb-redis-ext"
start_sb sb-redis-ext "${SB[@]}" "${SB_REDIS[@]}" sandboxd/redis-ext:7 \
	--loadmodule /usr/lib/redis/modules/redisearch.so
wait_log "$sre" 'Ready to accept connections' 1
check_kv "$sre" redis-cli
cli_sb "$sre" redis-cli MODULE LIST | grep -qx ft || fail "module 'ft' not listed"
cli_sb "$sre" redis-cli FT.CREATE idx SCHEMA title TEXT >/dev/null || fail "FT.CREATE"
cli_sb "$sre" redis-cli FT.ADD idx doc1 1.0 FIELDS title 'hello world' >/dev/null || fail "FT.ADD"
[[ "$(cli_sb "$sre" redis-cli FT.SEARCH idx hello | head -n1)" == 1 ]] || fail "FT.SEARCH"

log "valkey:8 sandbox mode"
sv="$PREFIX-sb-valkey"
start_sb sb-valkey "${SB[@]}" "${SB_REDIS[@]}" sandboxd/valkey:8
wait_log "$sv" 'Ready to accept connections' 1
check_kv "$sv" valkey-cli

log "redis:7 and valkey:8 sandbox mode input errors"
for img in redis:7 valkey:8; do
	expect_exit 64 'no SANDBOXD_PASSWORD on standard input' '' "${SB[@]}" "${SB_REDIS[@]}" "sandboxd/$img"
	expect_exit 64 'unknown key on line 1 of standard input' "$SPW=x\n" "${SB[@]}" "${SB_REDIS[@]}" "sandboxd/$img"
	expect_exit 64 'never runs as root' "$pw_line" --user 0:0 -e SANDBOXD_SANDBOX=1 "sandboxd/$img"
	expect_exit 64 '/run/sandboxd must be a writable directory' "$pw_line" \
		--user 999:999 --read-only -e SANDBOXD_SANDBOX=1 "sandboxd/$img"
done

log "all checks passed"
