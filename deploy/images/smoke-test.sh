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
# data commands work, modules only from the arguments), every allowlisted
# feature at work (postgres-ext: vector and postgis in one database;
# redis/valkey: JSON.*, FT.* on JSON documents, BF.*), the input errors
# (exit 64/65), and that the password shows in no `docker inspect`, `docker
# logs`, process argv or environment in the container, nor host `ps`.
# Persistent sandbox mode (SANDBOXD_PERSISTENT=1, named volumes): data
# survives `docker kill` and a new container on the same volume, the
# password given to the new container is the one that works, a feature
# added later is created, an interrupted first initialisation is recovered.
# The images' labels (io.sandboxd.sandbox-mode, io.sandboxd.features).
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
	docker exec -i "$c" bash -c 'read -r PGPASSWORD; export PGPASSWORD; exec psql -h 127.0.0.1 -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=sqlstate -At "$@"' \
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

# --- labels -------------------------------------------------------------------
log "labels"
for spec in postgres:17=citext,pg_trgm,uuid-ossp postgres-ext:17=citext,pg_trgm,postgis,uuid-ossp,vector \
	redis:8=bloom,json,search valkey:8=bloom,json,search; do
	img=sandboxd/${spec%%=*}
	got=$(docker image inspect -f '{{index .Config.Labels "io.sandboxd.sandbox-mode"}}|{{index .Config.Labels "io.sandboxd.features"}}' "$img")
	[[ $got == "1|${spec#*=}" ]] || fail "$img: labels sandbox-mode|features are '$got', expected '1|${spec#*=}'"
done
for img in redis:8 valkey:8; do
	[[ "$(docker run --rm --entrypoint stat "sandboxd/$img" -c '%a %U' /usr/lib/redis/modules/rejson.so \
		/usr/lib/redis/modules/redisearch.so /usr/lib/redis/modules/redisbloom.so | sort -u)" == "755 root" ]] ||
		fail "sandboxd/$img: the modules are not root-owned and executable"
	docker run --rm --entrypoint cat "sandboxd/$img" /usr/share/doc/redis-stack-modules/RSALv2.txt \
		/usr/share/doc/redis-stack-modules/SSPLv1.txt /usr/share/doc/redis-stack-modules/NOTICE >/dev/null ||
		fail "sandboxd/$img: the modules' licence texts are missing"
done

# --- postgres, tmpfs --------------------------------------------------------
log "postgres:17 on tmpfs with extra args"
pg="$PREFIX-pg"
start pg "${PROFILE[@]}" --tmpfs /var/lib/postgresql/data:rw,size=256m \
	-e POSTGRES_USER=u1 -e POSTGRES_PASSWORD="$PW" -e POSTGRES_DB=d1 \
	-p 127.0.0.1::5432 sandboxd/postgres:17 -c max_connections=50
wait_log "$pg" 'ready to accept connections' 2
[[ "$(docker logs "$pg" 2>&1 | grep -c 'listening on IPv4')" == 1 ]] ||
	fail "'listening on IPv4' logged more than once (temporary server on TCP?)"
[[ "$(psql_in "$pg" u1 d1 "select current_user, current_database(), current_setting('max_connections'), current_setting('server_version_num')::int / 10000")" == "u1|d1|50|17" ]] ||
	fail "postgres login, settings or version"
docker exec -e PGPASSWORD=wrong "$pg" psql -h 127.0.0.1 -U u1 -d d1 -c 'select 1' >/dev/null 2>&1 &&
	fail "wrong password accepted"
docker exec "$pg" pg_isready -q || fail "pg_isready via docker exec"
port=$(host_port "$pg" 5432)
(exec 3<>"/dev/tcp/127.0.0.1/$port") || fail "published port $port not reachable"
if command -v psql >/dev/null; then
	[[ "$(psql "postgresql://u1:$PW@127.0.0.1:$port/d1" -Atc 'select 1')" == 1 ]] || fail "host psql"
fi

# --- postgres, named volume and restart -------------------------------------
log "postgres:17 on a named volume, restarted"
vol="$PREFIX-pgdata"
docker volume create "$vol" >/dev/null
VOLUMES+=("$vol")
pgv="$PREFIX-pgv"
start pgv "${PROFILE[@]}" -v "$vol:/var/lib/postgresql/data" \
	-e POSTGRES_PASSWORD="$PW" sandboxd/postgres:17
wait_log "$pgv" 'ready to accept connections' 2
psql_in "$pgv" postgres postgres 'create table t(x int); insert into t values (42)' >/dev/null
docker stop -t 30 "$pgv" >/dev/null
docker start "$pgv" >/dev/null
wait_log "$pgv" 'ready to accept connections' 3
[[ "$(psql_in "$pgv" postgres postgres 'select x from t')" == 42 ]] || fail "data lost on restart"

# --- postgres-ext -------------------------------------------------------------
log "postgres-ext:17 extensions, vector and postgis in one database"
pge="$PREFIX-pge"
start pge "${PROFILE[@]}" --tmpfs /var/lib/postgresql/data:rw,size=256m \
	-e POSTGRES_USER=u1 -e POSTGRES_PASSWORD="$PW" -e POSTGRES_DB=d1 sandboxd/postgres-ext:17
wait_log "$pge" 'ready to accept connections' 2
psql_in "$pge" u1 d1 'CREATE EXTENSION vector; CREATE EXTENSION postgis; CREATE EXTENSION pg_trgm; CREATE EXTENSION citext; CREATE EXTENSION "uuid-ossp";' >/dev/null ||
	fail "CREATE EXTENSION"
[[ "$(psql_in "$pge" u1 d1 "select ST_AsText(ST_Point(1,2)), similarity('abc','abc'), 'A'::citext = 'a', uuid_generate_v4() is not null, '[1,2,3]'::vector <-> '[1,2,4]'")" == "POINT(1 2)|1|t|t|1" ]] ||
	fail "extension functions"

# --- redis ----------------------------------------------------------------------
log "redis:8 without and with a password"
r="$PREFIX-redis"
start redis "${PROFILE[@]}" --tmpfs /data:rw,size=64m -p 127.0.0.1::6379 sandboxd/redis:8
wait_log "$r" 'Ready to accept connections' 1
port=$(host_port "$r" 6379)
# No config file, protected mode off: reachable through the published port.
reply=$(exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'PING\r\n' >&3 && head -c 5 <&3)
[[ "$reply" == "+PONG" ]] || fail "redis via published port: $reply"
[[ "$(redis_in "$r" SAVE)" == OK ]] || fail "redis cannot write /data"
[[ "$(docker exec "$r" stat -c %U /data/dump.rdb)" == redis ]] || fail "dump.rdb not owned by redis"
[[ "$(redis_in "$r" INFO server | grep -o 'redis_version:8\.' )" == "redis_version:8." ]] || fail "not Redis 8"

ra="$PREFIX-redis-auth"
start redis-auth "${PROFILE[@]}" --tmpfs /data:rw,size=64m sandboxd/redis:8 --requirepass "$PW" --save ''
wait_log "$ra" 'Ready to accept connections' 1
[[ "$(redis_in "$ra" PING 2>&1)" == *NOAUTH* ]] || fail "requirepass not applied"
[[ "$(redis_in "$ra" -a "$PW" CONFIG GET save | tail -n1)" == "" ]] || fail "--save '' not applied"

log "redis:8 MODULE LOAD in plain mode"
rm_="$PREFIX-redis-modload"
start redis-modload "${PROFILE[@]}" --tmpfs /data:rw,size=64m sandboxd/redis:8 \
	--requirepass "$PW" --enable-module-command yes
wait_log "$rm_" 'Ready to accept connections' 1
[[ "$(redis_in "$rm_" -a "$PW" MODULE LOAD /usr/lib/redis/modules/redisbloom.so)" == OK ]] || fail "MODULE LOAD"
redis_in "$rm_" -a "$PW" MODULE LIST | grep -qx bf || fail "module 'bf' not listed"
[[ "$(redis_in "$rm_" -a "$PW" BF.ADD b x)" == 1 ]] || fail "BF.ADD after MODULE LOAD"

# --- valkey ---------------------------------------------------------------------
log "valkey:8 without a password"
v="$PREFIX-valkey"
start valkey "${PROFILE[@]}" --tmpfs /data:rw,size=64m sandboxd/valkey:8
wait_log "$v" 'Ready to accept connections' 1
[[ "$(docker exec "$v" valkey-cli SAVE)" == OK ]] || fail "valkey cannot write /data"
[[ "$(docker exec "$v" stat -c %U /data/dump.rdb)" == valkey ]] || fail "dump.rdb not owned by valkey"
[[ "$(docker exec "$v" valkey-cli INFO server | grep -o 'valkey_version:8\.[1-9]')" == valkey_version:8.* ]] || fail "not Valkey 8.1+"

# === sandbox mode ================================================================
# --- postgres ----------------------------------------------------------------------
log "postgres:17 sandbox mode"
sp="$PREFIX-sb-pg"
start_sb sb-pg "${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=hstore,citext -p 127.0.0.1::5432 \
	sandboxd/postgres:17 -c fsync=off -c synchronous_commit=off -c full_page_writes=off
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
# Sandbox clusters have no `postgres` database any more (one less database
# in memory); where one exists, the role may not connect to it.
[[ $out == *"permission denied for database"* || $out == *'database "postgres" does not exist'* ]] ||
	fail "database postgres: $out"
docker exec -i "$sp" bash -c 'PGPASSWORD=wrongwrongwrong psql -h 127.0.0.1 -U sandbox -d sandbox -c "select 1"' >/dev/null 2>&1 &&
	fail "wrong password accepted"
docker exec "$sp" pg_isready -q || fail "pg_isready via docker exec"
port=$(host_port "$sp" 5432)
(exec 3<>"/dev/tcp/127.0.0.1/$port") || fail "published port $port not reachable"
check_no_leak "$sp"

# pg_features NAME USER DB: vector and postgis at work in one database.
pg_features() {
	local c=$1 u=$2 d=$3
	[[ "$(psql_sb "$c" "$u" "$d" 'SET client_min_messages = warning' \
		'CREATE EXTENSION IF NOT EXISTS vector' 'CREATE EXTENSION IF NOT EXISTS postgis' \
		"select string_agg(extname, ',' order by extname) from pg_extension where extname in ('vector', 'postgis')")" == postgis,vector ]] ||
		fail "$c: CREATE EXTENSION IF NOT EXISTS vector, postgis"
	[[ "$(psql_sb "$c" "$u" "$d" \
		'CREATE TABLE items (id int PRIMARY KEY, embedding vector(3))' \
		"INSERT INTO items VALUES (1, '[1,2,3]'), (2, '[4,5,6]'), (3, '[10,10,10]')" \
		"SELECT id FROM items ORDER BY embedding <-> '[3.9,5.2,6.1]' LIMIT 1")" == 2 ]] ||
		fail "$c: vector nearest neighbour"
	[[ "$(psql_sb "$c" "$u" "$d" "SELECT ST_Distance('POINT(0 0)'::geometry, 'POINT(3 4)'::geometry)")" == 5 ]] ||
		fail "$c: ST_Distance"
}

log "postgres-ext:17 sandbox mode with every feature in one database"
spe="$PREFIX-sb-pge"
start_sb sb-pge "${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=vector,postgis,pg_trgm,citext,uuid-ossp \
	-e SANDBOXD_USER=agent -e SANDBOXD_DATABASE=app sandboxd/postgres-ext:17
wait_log "$spe" 'ready to accept connections' 2
[[ "$(psql_sb "$spe" agent app "select rolsuper from pg_roles where rolname = current_user" \
	"select string_agg(extname || ':' || extowner::regrole || ':' || extnamespace::regnamespace, ',' order by extname) from pg_extension")" == \
	$'f\ncitext:postgres:public,pg_trgm:postgres:public,plpgsql:postgres:pg_catalog,postgis:postgres:public,uuid-ossp:postgres:public,vector:postgres:public' ]] ||
	fail "features not created by the superuser in public"
pg_features "$spe" agent app
[[ "$(psql_sb "$spe" agent app "select ST_AsText(ST_Point(1,2)), uuid_generate_v4() is not null, similarity('abc','abc'), 'A'::citext = 'a'")" == 'POINT(1 2)|t|1|t' ]] ||
	fail "contrib features"
check_no_leak "$spe"

log "postgres:17 sandbox mode input errors"
pw_line="SANDBOXD_PASSWORD=$SPW\n"
expect_exit 64 'no SANDBOXD_PASSWORD on standard input' '' "${SB[@]}" "${SB_PG[@]}" sandboxd/postgres:17
expect_exit 64 'unknown key SANDBOXD_PASSWD on standard input (allowed keys: SANDBOXD_PASSWORD)' \
	"SANDBOXD_PASSWD=$SPW\n$pw_line" "${SB[@]}" "${SB_PG[@]}" sandboxd/postgres:17
expect_exit 64 'must be 16 to 128 characters' "SANDBOXD_PASSWORD=short\n" "${SB[@]}" "${SB_PG[@]}" sandboxd/postgres:17
expect_exit 64 'SANDBOXD_FEATURES must be' "$pw_line" "${SB[@]}" "${SB_PG[@]}" -e 'SANDBOXD_FEATURES=x;y' sandboxd/postgres:17
expect_exit 64 'SANDBOXD_PERSISTENT must be 1' "$pw_line" "${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_PERSISTENT=yes sandboxd/postgres:17
expect_exit 64 'never runs as root' "$pw_line" --user 0:0 -e SANDBOXD_SANDBOX=1 sandboxd/postgres:17
expect_exit 65 'feature "postgis" is not available in this image: ' "$pw_line" \
	"${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=pg_trgm,postgis sandboxd/postgres:17
expect_exit 65 'feature "vector" is not available in this image: ' "$pw_line" \
	"${SB[@]}" "${SB_PG[@]}" -e SANDBOXD_FEATURES=vector sandboxd/postgres:17

# --- redis, valkey ---------------------------------------------------------------
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
		"MODULE UNLOAD bf" "REPLICAOF 127.0.0.1 6380" "SLAVEOF 127.0.0.1 6380" "DEBUG SLEEP 0" "SHUTDOWN NOSAVE" \
		"ACL SETUSER x on" "SAVE" "BGSAVE" "BGREWRITEAOF" "MONITOR" "FAILOVER" \
		"PFSELFTEST" "PFDEBUG GETREG hll" "SCRIPT DEBUG YES" "REPLCONF listening-port 6380" \
		"FUNCTION RESTORE x" "CONFIG RESETSTAT"; do
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
MODULE_ARGS=(--loadmodule /usr/lib/redis/modules/rejson.so --loadmodule /usr/lib/redis/modules/redisearch.so
	--loadmodule /usr/lib/redis/modules/redisbloom.so)
# check_modules NAME CLI: the three modules loaded (the names the controller
# looks for in INFO modules) and their commands at work for the agent.
check_modules() {
	local c=$1 cli=$2 out
	out=$(cli_sb "$c" "$cli" INFO modules)
	for m in ReJSON search bf; do
		grep -q "^module:name=$m," <<<"${out//$'\r'/}" || fail "$c: module $m not in INFO modules: $out"
	done
	[[ "$(cli_sb "$c" "$cli" FT.CREATE idx ON JSON PREFIX 1 doc: SCHEMA '$.name' AS name TEXT)" == OK ]] || fail "$c: FT.CREATE ON JSON"
	[[ "$(cli_sb "$c" "$cli" JSON.SET doc:1 '$' '{"name":"alice","n":1}')" == OK ]] || fail "$c: JSON.SET"
	[[ "$(cli_sb "$c" "$cli" JSON.SET doc:2 '$' '{"name":"bob","n":2}')" == OK ]] || fail "$c: JSON.SET"
	[[ "$(cli_sb "$c" "$cli" JSON.GET doc:1 '$.name')" == '["alice"]' ]] || fail "$c: JSON.GET"
	out=$(cli_sb "$c" "$cli" FT.SEARCH idx '@name:alice')
	[[ ${out%%$'\n'*} == 1 && $out == *doc:1* && $out != *doc:2* ]] || fail "$c: FT.SEARCH: $out"
	[[ "$(cli_sb "$c" "$cli" BF.ADD bloom x)" == 1 ]] || fail "$c: BF.ADD"
	[[ "$(cli_sb "$c" "$cli" BF.EXISTS bloom x)" == 1 ]] || fail "$c: BF.EXISTS x"
	[[ "$(cli_sb "$c" "$cli" BF.EXISTS bloom y)" == 0 ]] || fail "$c: BF.EXISTS y"
}

for spec in redis:8:redis-cli valkey:8:valkey-cli; do
	img=${spec%:*} cli=${spec##*:}
	log "$img sandbox mode"
	c="$PREFIX-sb-${img%%:*}"
	start_sb "sb-${img%%:*}" "${SB[@]}" "${SB_REDIS[@]}" "sandboxd/$img"
	wait_log "$c" 'Ready to accept connections' 1
	check_kv "$c" "$cli"
	[[ -z "$(cli_sb "$c" "$cli" INFO modules | grep '^module:name=' | grep -v '^module:name=vectorset,')" ]] ||
		fail "$c: a module is loaded"

	log "$img sandbox mode with the modules rejson, redisearch, redisbloom"
	c="$PREFIX-sb-${img%%:*}-mod"
	start_sb "sb-${img%%:*}-mod" "${SB[@]}" "${SB_REDIS[@]}" "sandboxd/$img" "${MODULE_ARGS[@]}"
	wait_log "$c" 'Ready to accept connections' 1
	check_modules "$c" "$cli"
	check_kv "$c" "$cli"
done

log "redis:8 and valkey:8 sandbox mode input errors"
for img in redis:8 valkey:8; do
	expect_exit 64 'no SANDBOXD_PASSWORD on standard input' '' "${SB[@]}" "${SB_REDIS[@]}" "sandboxd/$img"
	expect_exit 64 'unknown key on line 1 of standard input' "$SPW=x\n" "${SB[@]}" "${SB_REDIS[@]}" "sandboxd/$img"
	expect_exit 64 'SANDBOXD_PERSISTENT must be 1' "$pw_line" "${SB[@]}" "${SB_REDIS[@]}" -e SANDBOXD_PERSISTENT=0 "sandboxd/$img"
	expect_exit 64 'never runs as root' "$pw_line" --user 0:0 -e SANDBOXD_SANDBOX=1 "sandboxd/$img"
	expect_exit 64 '/run/sandboxd must be a writable directory' "$pw_line" \
		--user 999:999 --read-only -e SANDBOXD_SANDBOX=1 "sandboxd/$img"
done

# === persistent sandbox mode =======================================================
# Named volumes as Docker makes them: the first container populates the
# volume from the image's directory (owner 999, PGDATA mode 0700).
new_volume() { # VAR NAME: creates and records the volume $PREFIX-NAME, sets VAR
	printf -v "$1" '%s' "$PREFIX-$2"
	docker volume create "$PREFIX-$2" >/dev/null
	VOLUMES+=("$PREFIX-$2")
}
SB_PG_RUN=("${SB_PG[@]:2}") # /var/run/postgresql and /tmp, without the PGDATA tmpfs
SB_REDIS_RUN=("${SB_REDIS[@]:2}")
# kill_gone NAME: docker kill, then wait until it is no longer running.
kill_gone() {
	docker kill "$1" >/dev/null
	docker wait "$1" >/dev/null || :
}

log "postgres-ext:17 persistent: a kept volume across docker kill"
new_volume pvol pgkeep
c="$PREFIX-sb-pgkeep-1"
start_sb sb-pgkeep-1 "${SB[@]}" "${SB_PG_RUN[@]}" -v "$pvol:/var/lib/postgresql/data" \
	-e SANDBOXD_PERSISTENT=1 -e SANDBOXD_FEATURES=vector,pg_trgm sandboxd/postgres-ext:17
wait_log "$c" 'ready to accept connections' 2
[[ "$(psql_sb "$c" sandbox sandbox "select current_setting('fsync')" 'CREATE TABLE kept (x int)' 'INSERT INTO kept VALUES (7)' \
	'CREATE TABLE v (id int, e vector(3))' "INSERT INTO v VALUES (1, '[1,1,1]')" 'SELECT count(*) FROM kept')" == $'on\n1' ]] ||
	fail "$c: writes on a persistent volume"
[[ "$(docker run --rm --entrypoint stat -v "$pvol:/d" sandboxd/postgres:17 -c '%a %u' /d)" == "700 999" ]] ||
	fail "$pvol: not 0700 owned by 999"
kill_gone "$c"
c="$PREFIX-sb-pgkeep-2"
SPW_OLD=$SPW
SPW="Sbx$(printf '%04x' "$RANDOM" "$RANDOM" "$RANDOM" "$RANDOM")Nw" # the controller may rotate it
start_sb sb-pgkeep-2 "${SB[@]}" "${SB_PG_RUN[@]}" -v "$pvol:/var/lib/postgresql/data" \
	-e SANDBOXD_PERSISTENT=1 -e SANDBOXD_FEATURES=vector,pg_trgm,postgis sandboxd/postgres-ext:17
wait_log "$c" 'ready to accept connections' 2
[[ "$(docker logs "$c" 2>&1)" == *'reusing the database cluster'* ]] || fail "$c: the kept cluster was not reused"
[[ "$(psql_sb "$c" sandbox sandbox 'SELECT x FROM kept' "SELECT id FROM v ORDER BY e <-> '[1,1,2]' LIMIT 1")" == $'7\n1' ]] ||
	fail "$c: data lost across docker kill and a new container"
[[ "$(psql_sb "$c" sandbox sandbox "SELECT ST_Distance('POINT(0 0)'::geometry, 'POINT(3 4)'::geometry)" \
	"select string_agg(extname || ':' || extnamespace::regnamespace, ',' order by extname) from pg_extension where extname <> 'plpgsql'")" == \
	$'5\npg_trgm:public,postgis:sandboxd_features,vector:public' ]] ||
	fail "$c: postgis added to the kept cluster"
out=$(docker exec -i "$c" bash -c 'read -r PGPASSWORD; export PGPASSWORD; psql -h 127.0.0.1 -U sandbox -d sandbox -Atc "select 1"' <<<"$SPW_OLD" 2>&1) &&
	fail "$c: the previous container's password still works"
check_no_leak "$c"
# The agent shadows the catalog for sessions in its database; the next
# container's superuser sessions must not care.
psql_sb "$c" sandbox sandbox 'CREATE SCHEMA evil' 'CREATE TABLE evil.pg_extension (extname name)' \
	'ALTER DATABASE sandbox SET search_path = evil, pg_catalog, public' >/dev/null || fail "$c: agent setup"
kill_gone "$c"
c="$PREFIX-sb-pgkeep-3"
start_sb sb-pgkeep-3 "${SB[@]}" "${SB_PG_RUN[@]}" -v "$pvol:/var/lib/postgresql/data" \
	-e SANDBOXD_PERSISTENT=1 -e SANDBOXD_FEATURES=vector,pg_trgm,postgis,citext sandboxd/postgres-ext:17
wait_log "$c" 'ready to accept connections' 2
[[ "$(psql_sb "$c" sandbox sandbox "select string_agg(extname || ':' || extnamespace::regnamespace, ',' order by extname) from pg_catalog.pg_extension where extname <> 'plpgsql'" \
	"select 'A'::citext = 'a', x from kept")" == $'citext:public,pg_trgm:public,postgis:sandboxd_features,vector:public\nt|7' ]] ||
	fail "$c: citext added under the agent's search_path"

log "postgres:17 persistent: refusals and an interrupted first start"
# Without SANDBOXD_PERSISTENT a kept cluster is refused, and so is another major's.
expect_exit 64 'already holds a cluster' "SANDBOXD_PASSWORD=$SPW\n" "${SB[@]}" "${SB_PG_RUN[@]}" \
	-v "$pvol:/var/lib/postgresql/data" sandboxd/postgres:17
new_volume ovol pgold
docker run --rm --user 999:999 --entrypoint sh -v "$ovol:/var/lib/postgresql/data" sandboxd/postgres:17 \
	-c 'echo 15 >/var/lib/postgresql/data/PG_VERSION'
expect_exit 64 'holds a PostgreSQL 15 cluster' "SANDBOXD_PASSWORD=$SPW\n" "${SB[@]}" "${SB_PG_RUN[@]}" \
	-v "$ovol:/var/lib/postgresql/data" -e SANDBOXD_PERSISTENT=1 sandboxd/postgres:17
# A first start killed in initdb leaves its staging directory: started again.
new_volume ivol pginit
docker run --rm --user 999:999 --entrypoint sh -v "$ivol:/var/lib/postgresql/data" sandboxd/postgres:17 \
	-c 'mkdir -p /var/lib/postgresql/data/.sandboxd-initdb/base && echo 17 >/var/lib/postgresql/data/.sandboxd-initdb/PG_VERSION'
c="$PREFIX-sb-pginit"
start_sb sb-pginit "${SB[@]}" "${SB_PG_RUN[@]}" -v "$ivol:/var/lib/postgresql/data" \
	-e SANDBOXD_PERSISTENT=1 -e SANDBOXD_FEATURES=citext sandboxd/postgres:17
wait_log "$c" 'ready to accept connections' 2
[[ "$(psql_sb "$c" sandbox sandbox "select 'A'::citext = 'a'")" == t ]] || fail "$c: after an interrupted first start"
[[ "$(docker exec "$c" ls -A /var/lib/postgresql/data | grep -c sandboxd-initdb)" == 0 ]] || fail "$c: staging directory left"
# One killed while moving a complete cluster into place: the moves are finished.
new_volume mvol pgmove
docker run --rm --user 999:999 --entrypoint bash -v "$mvol:/var/lib/postgresql/data" sandboxd/postgres:17 \
	-c 'set -e; d=/var/lib/postgresql/data; initdb -U postgres --auth-local=peer --auth-host=scram-sha-256 -D $d/.sandboxd-initdb >/dev/null
		: >$d/.sandboxd-initdb/.complete; mv $d/.sandboxd-initdb/base $d/.sandboxd-initdb/global $d/'
c="$PREFIX-sb-pgmove"
start_sb sb-pgmove "${SB[@]}" "${SB_PG_RUN[@]}" -v "$mvol:/var/lib/postgresql/data" \
	-e SANDBOXD_PERSISTENT=1 sandboxd/postgres:17
wait_log "$c" 'ready to accept connections' 2
[[ "$(docker logs "$c" 2>&1)" == *'finishing an initialisation'* ]] || fail "$c: the interrupted moves were not finished"
[[ "$(psql_sb "$c" sandbox sandbox "select current_user")" == sandbox ]] || fail "$c: after interrupted moves"
[[ "$(docker exec "$c" ls -A /var/lib/postgresql/data | grep -c sandboxd-initdb)" == 0 ]] || fail "$c: staging directory left"

for spec in redis:8:redis-cli valkey:8:valkey-cli; do
	img=${spec%:*} cli=${spec##*:} name=${spec%%:*}
	log "$img persistent: a kept /data across docker kill"
	new_volume rvol "${name}keep"
	c="$PREFIX-sb-${name}keep-1"
	start_sb "sb-${name}keep-1" "${SB[@]}" "${SB_REDIS_RUN[@]}" -v "$rvol:/data" -e SANDBOXD_PERSISTENT=1 \
		"sandboxd/$img" "${MODULE_ARGS[@]}"
	wait_log "$c" 'Ready to accept connections' 1
	[[ "$(cli_sb "$c" "$cli" CONFIG GET appendonly | tail -n1)" == yes ]] || fail "$c: appendonly is not on"
	[[ "$(cli_sb "$c" "$cli" CONFIG GET appendfsync | tail -n1)" == everysec ]] || fail "$c: appendfsync"
	check_modules "$c" "$cli"
	[[ "$(cli_sb "$c" "$cli" SET kept yes)" == OK ]] || fail "$c: SET"
	sleep 1.5 # appendfsync everysec
	kill_gone "$c"
	c="$PREFIX-sb-${name}keep-2"
	start_sb "sb-${name}keep-2" "${SB[@]}" "${SB_REDIS_RUN[@]}" -v "$rvol:/data" -e SANDBOXD_PERSISTENT=1 \
		"sandboxd/$img" "${MODULE_ARGS[@]}"
	wait_log "$c" 'Ready to accept connections' 1
	[[ "$(cli_sb "$c" "$cli" GET kept)" == yes ]] || fail "$c: GET after docker kill"
	[[ "$(cli_sb "$c" "$cli" JSON.GET doc:2 '$.n')" == '[2]' ]] || fail "$c: JSON.GET after docker kill"
	[[ "$(cli_sb "$c" "$cli" BF.EXISTS bloom x)" == 1 ]] || fail "$c: BF.EXISTS after docker kill"
	out=$(cli_sb "$c" "$cli" FT.SEARCH idx '@name:bob')
	[[ ${out%%$'\n'*} == 1 && $out == *doc:2* ]] || fail "$c: FT.SEARCH after docker kill: $out"
	[[ "$(cli_sb "$c" "$cli" SAVE 2>&1)" == NOPERM* ]] || fail "$c: SAVE allowed"
	check_no_leak "$c"
done

log "all checks passed"
