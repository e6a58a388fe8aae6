#!/usr/bin/env bash
# Entrypoint of sandboxd/postgres:15, compatible with the official image:
#   POSTGRES_PASSWORD (or _FILE)  required unless POSTGRES_HOST_AUTH_METHOD=trust
#   POSTGRES_USER (or _FILE)      superuser to create, default postgres
#   POSTGRES_DB (or _FILE)        database to create, default $POSTGRES_USER
#   POSTGRES_INITDB_ARGS          extra initdb arguments
#   POSTGRES_HOST_AUTH_METHOD     auth for host connections, default scram-sha-256
#   PGDATA                        default /var/lib/postgresql/data
#   /docker-entrypoint-initdb.d/  *.sh, *.sql, *.sql.gz run once after initdb
# Arguments starting with '-' are passed to postgres. Started as root it only
# fixes the ownership of $PGDATA (CAP_CHOWN) and drops to the postgres user
# (CAP_SETUID, CAP_SETGID); everything else runs as postgres. The temporary
# server used during initialisation listens on the Unix socket only, so
# "listening on IPv4 address" is only ever logged by the real server.
set -Eeuo pipefail

log() { printf '%s [entrypoint] %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$*" >&2; }

# file_env VAR [DEFAULT]: VAR or the content of the file named by VAR_FILE.
file_env() {
	local var=$1 fvar="${1}_FILE" def="${2:-}"
	if [[ -n "${!var:-}" && -n "${!fvar:-}" ]]; then
		log "error: both $var and $fvar are set (but are exclusive)"
		exit 1
	fi
	local val=$def
	if [[ -n "${!var:-}" ]]; then
		val=${!var}
	elif [[ -n "${!fvar:-}" ]]; then
		val=$(<"${!fvar}")
	fi
	export "$var"="$val"
	unset "$fvar"
}

if [[ "${1:-}" == -* ]]; then
	set -- postgres "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [[ "${1:-}" != postgres ]]; then
	exec "$@"
fi

# --- as root: the data directory's owner, then drop privileges -------------
if [[ "$(id -u)" == 0 ]]; then
	mkdir -p "$PGDATA"
	if [[ "$(stat -c %u "$PGDATA")" != "$(id -u postgres)" ]]; then
		# chmod while root still owns it (no CAP_FOWNER needed), then chown.
		chmod 0700 "$PGDATA"
		chown postgres:postgres "$PGDATA"
	fi
	export HOME=/var/lib/postgresql USER=postgres LOGNAME=postgres
	exec setpriv --reuid=postgres --regid=postgres --init-groups -- "${BASH_SOURCE[0]}" "$@"
fi

# --- as postgres (or whatever --user the container runs as) -----------------
chmod 0700 "$PGDATA" 2>/dev/null || :
mkdir -p /var/run/postgresql 2>/dev/null || :
chmod 3777 /var/run/postgresql 2>/dev/null || :

if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
	file_env POSTGRES_PASSWORD
	file_env POSTGRES_USER postgres
	file_env POSTGRES_DB "$POSTGRES_USER"
	file_env POSTGRES_INITDB_ARGS
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"

	if [[ -z "$POSTGRES_PASSWORD" && "$POSTGRES_HOST_AUTH_METHOD" != trust ]]; then
		cat >&2 <<-'EOF'
			Error: Database is uninitialized and superuser password is not specified.
			       You must specify POSTGRES_PASSWORD to a non-empty value for the
			       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".

			       You may also use "POSTGRES_HOST_AUTH_METHOD=trust" to allow all
			       connections without a password. This is *not* recommended.
		EOF
		exit 1
	fi
	log "initialising database cluster in $PGDATA"
	initdb_args=(--username="$POSTGRES_USER" --auth-local=trust --auth-host="$POSTGRES_HOST_AUTH_METHOD")
	# shellcheck disable=SC2206 # POSTGRES_INITDB_ARGS is split on purpose
	initdb_args+=($POSTGRES_INITDB_ARGS)
	if [[ -n "$POSTGRES_PASSWORD" ]]; then
		# The password goes through a pipe, never through argv.
		initdb "${initdb_args[@]}" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") >&2
	else
		initdb "${initdb_args[@]}" >&2
	fi
	printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

	# Temporary server: the container's postgres arguments (so that e.g.
	# shared_preload_libraries apply to init scripts), then Unix socket only.
	tmp_opts=("${@:2}" -c "listen_addresses=" -p 5432)
	pg_ctl -D "$PGDATA" -w -o "$(printf '%q ' "${tmp_opts[@]}")" start >&2

	export PGUSER="$POSTGRES_USER" PGHOST=/var/run/postgresql PGPORT=5432
	psql_init=(psql -v ON_ERROR_STOP=1 --no-password --no-psqlrc -q)
	if [[ "$POSTGRES_DB" != postgres ]]; then
		"${psql_init[@]}" --dbname postgres --set db="$POSTGRES_DB" <<-'EOSQL'
			CREATE DATABASE :"db";
		EOSQL
	fi
	shopt -s nullglob
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			if [[ -x "$f" ]]; then
				log "running $f"
				"$f"
			else
				log "sourcing $f"
				# shellcheck disable=SC1090
				. "$f"
			fi
			;;
		*.sql) log "running $f"; "${psql_init[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
		*.sql.gz) log "running $f"; gunzip -c "$f" | "${psql_init[@]}" --dbname "$POSTGRES_DB" ;;
		*) log "ignoring $f" ;;
		esac
	done
	shopt -u nullglob

	pg_ctl -D "$PGDATA" -m fast -w stop >&2
	unset PGUSER PGHOST PGPORT
	log "PostgreSQL init process complete; ready for start up."
fi
unset POSTGRES_PASSWORD

exec "$@"
