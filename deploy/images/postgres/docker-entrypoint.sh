#!/usr/bin/env bash
# Entrypoint of sandboxd/postgres:17 (and sandboxd/postgres-ext:17).
#
# Plain mode (SANDBOXD_SANDBOX unset or empty), compatible with the official
# image:
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
#
# Sandbox mode (SANDBOXD_SANDBOX=1), see "Sandbox mode" in
# deploy/images/README.md: started as uid 999 (never root, no capability
# needed), reads KEY=VALUE lines from standard input until EOF (only
# SANDBOXD_PASSWORD, required), or from the file SANDBOXD_SECRETS_FILE names
# when it is set (a path under /run/secrets/, where Docker Swarm mounts a
# secret; standard input is then not read), creates a fresh cluster whose superuser
# `postgres` has no password and exists only on the Unix socket, a
# least-privileged login role SANDBOXD_USER (default sandbox) owning the
# database SANDBOXD_DATABASE (default sandbox), the extensions named in
# SANDBOXD_FEATURES, then execs postgres. With SANDBOXD_PERSISTENT=1 the data
# dir is a named volume kept across containers of one sandbox: an empty one
# is initialised as above (with fsync), one holding a cluster is reused (the
# role gets the password from stdin, a missing role, database or extension
# is created). Templates (SANDBOXD_TEMPLATE, with a named volume on
# /var/lib/postgresql/template): `build` (the volume read-write, no stdin)
# initialises a cluster with the role (no password), the database and the
# features in the volume's `cluster` directory and exits 0; it is
# crash-safe (built aside, renamed into place last) and exits 0 at once on
# a volume that already holds the template. `use` (the volume read-only)
# copies that cluster into the empty $PGDATA tmpfs, gives the role the
# password from stdin in single-user mode and execs postgres: no initdb, no
# temporary server. Exit 64: bad
# input (stdin, env, arguments, data dir, started as root); 65: a feature
# is not available.
# The password only ever lives in shell variables and pipes: it is never an
# argument of any program, never in the environment, never printed.
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

case "${SANDBOXD_SANDBOX:-}" in
'' | 1) ;;
*)
	printf 'sandboxd: SANDBOXD_SANDBOX must be 1 (sandbox mode) or unset\n' >&2
	exit 64
	;;
esac

if [[ "${1:-}" == -* ]]; then
	set -- postgres "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [[ "${1:-}" != postgres ]]; then
	exec "$@"
fi

# ===========================================================================
# Sandbox mode. Everything here runs as the user the container was started
# as. The password is kept in the shell variable sb_password only: it reaches
# postgres through a pipe from the printf builtin, never through argv or the
# environment, and is never printed.
# ===========================================================================
SB_KEYS="SANDBOXD_PASSWORD" # the keys accepted on standard input
SB_FROM="standard input"     # where they are read from (see sb_read_secrets)

sb_die() { # CODE MESSAGE
	printf 'sandboxd: %s\n' "$2" >&2
	exit "$1"
}

# sb_read_secrets: the secrets from standard input, or from the file
# SANDBOXD_SECRETS_FILE names (a Swarm secret): sets sb_password.
sb_read_secrets() {
	local file=${SANDBOXD_SECRETS_FILE:-}
	if [[ -z $file ]]; then
		sb_read_stdin
		return
	fi
	if [[ $file != /run/secrets/* || $file == *..* ]]; then
		sb_die 64 "SANDBOXD_SECRETS_FILE must name a file under /run/secrets/ (where Docker mounts secrets)"
	fi
	if [[ ! -f $file || ! -r $file ]]; then
		sb_die 64 "SANDBOXD_SECRETS_FILE names $file, which is not a file uid $(id -u) can read: mount the secret there, readable by that uid"
	fi
	SB_FROM=$file
	sb_read_stdin <"$file"
}

# sb_read_stdin: KEY=VALUE lines until EOF from $SB_FROM on standard input;
# sets sb_password.
sb_read_stdin() {
	local line key n=0 have=0
	sb_password=
	while IFS= read -r line || [[ -n $line ]]; do
		n=$((n + 1))
		[[ -n $line ]] || continue
		if [[ $line != *=* ]]; then
			line=
			sb_die 64 "line $n of $SB_FROM is not KEY=VALUE (allowed keys: $SB_KEYS)"
		fi
		key=${line%%=*}
		case "$key" in
		SANDBOXD_PASSWORD)
			((have == 0)) || { line=; sb_die 64 "SANDBOXD_PASSWORD given twice on $SB_FROM"; }
			sb_password=${line#*=}
			have=1
			;;
		*)
			line=
			# Name the key only when it looks like one: [A-Za-z0-9_]{1,64}
			# with a '_', which a password ([A-Za-z0-9]) never has.
			if [[ $key =~ ^[A-Za-z0-9_]{1,64}$ && $key == *_* ]]; then
				sb_die 64 "unknown key $key on $SB_FROM (allowed keys: $SB_KEYS)"
			fi
			sb_die 64 "unknown key on line $n of $SB_FROM (allowed keys: $SB_KEYS)"
			;;
		esac
	done
	line=
	if ((have == 0)); then
		sb_die 64 "no SANDBOXD_PASSWORD on $SB_FROM: in sandbox mode this image reads its secrets from stdin or SANDBOXD_SECRETS_FILE (see deploy/images/README.md)"
	fi
	if ! [[ $sb_password =~ ^[A-Za-z0-9]{16,128}$ ]]; then
		sb_password=
		sb_die 64 "SANDBOXD_PASSWORD on $SB_FROM must be 16 to 128 characters from A-Z a-z 0-9"
	fi
}

sb_stop_tmp() { pg_ctl -D "$PGDATA" -m fast -w stop >&2 || :; }

sandbox_main() {
	local user db features f err persistent template existing=0 v
	local -a feats=()

	if [[ "$(id -u)" == 0 ]]; then
		sb_die 64 "sandbox mode never runs as root: start the container with --user 999:999"
	fi
	for v in SANDBOXD_PASSWORD POSTGRES_PASSWORD POSTGRES_PASSWORD_FILE; do
		if [[ -n "${!v+x}" ]]; then
			sb_die 64 "$v is in the environment: in sandbox mode secrets are read from standard input or SANDBOXD_SECRETS_FILE only"
		fi
	done

	template=${SANDBOXD_TEMPLATE:-}
	case $template in
	'' | build | use) ;;
	*) sb_die 64 "SANDBOXD_TEMPLATE must be build (make a template), use (start from this image's template) or unset" ;;
	esac
	if [[ $template != build ]]; then
		sb_read_secrets
	fi

	user=${SANDBOXD_USER:-sandbox}
	db=${SANDBOXD_DATABASE:-sandbox}
	features=${SANDBOXD_FEATURES:-}
	if ! [[ $user =~ ^[a-z_][a-z0-9_]{0,62}$ ]] || [[ $user == postgres || $user == pg_* ]]; then
		sb_die 64 "SANDBOXD_USER must match ^[a-z_][a-z0-9_]{0,62}\$ and be neither postgres nor pg_*"
	fi
	if ! [[ $db =~ ^[a-z_][a-z0-9_-]{0,62}$ ]] || [[ $db == postgres || $db == template0 || $db == template1 ]]; then
		sb_die 64 "SANDBOXD_DATABASE must match ^[a-z_][a-z0-9_-]{0,62}\$ and not be postgres, template0 or template1"
	fi
	if [[ -n $features ]]; then
		IFS=, read -r -a feats <<<"$features,"
		for f in "${feats[@]}"; do
			[[ $f =~ ^[a-z0-9_-]+$ ]] ||
				sb_die 64 "SANDBOXD_FEATURES must be a comma-separated list of extension names matching ^[a-z0-9_-]+\$"
		done
	fi

	persistent=${SANDBOXD_PERSISTENT:-}
	if [[ -n $persistent && $persistent != 1 ]]; then
		sb_die 64 "SANDBOXD_PERSISTENT must be 1 (data on a named volume, kept) or unset"
	fi
	if [[ -n $template && $persistent == 1 ]]; then
		sb_die 64 "SANDBOXD_TEMPLATE cannot be combined with SANDBOXD_PERSISTENT=1: a template seeds a throwaway data dir"
	fi
	if [[ $template == build ]]; then
		sb_template_build_start
		PGDATA=$SB_TEMPLATE/.build
	fi

	# The data dir: a tmpfs, or with SANDBOXD_PERSISTENT=1 a named volume,
	# owned by the container's user; its mode is fixed here.
	if [[ ! -d $PGDATA || ! -w $PGDATA ]]; then
		if [[ $persistent == 1 ]]; then
			sb_die 64 "$PGDATA must be a writable directory: mount a named volume there (the image's $PGDATA is owned by uid 999)"
		fi
		sb_die 64 "$PGDATA must be a writable directory: mount a tmpfs owned by uid $(id -u) there"
	fi
	if [[ -e $PGDATA/PG_VERSION ]]; then
		if [[ $persistent != 1 ]]; then
			sb_die 64 "$PGDATA already holds a cluster: sandbox mode initialises a fresh one (mount an empty tmpfs, or set SANDBOXD_PERSISTENT=1 to keep a named volume's)"
		fi
		existing=1
		v=$(<"$PGDATA/PG_VERSION")
		if [[ $v != "$PG_MAJOR" ]]; then
			sb_die 64 "$PGDATA holds a PostgreSQL ${v:0:16} cluster, which PostgreSQL $PG_MAJOR cannot open: dump it with a PostgreSQL ${v:0:16} image and restore it into an empty volume"
		fi
	fi
	if [[ ! -d /var/run/postgresql || ! -w /var/run/postgresql ]]; then
		sb_die 64 "/var/run/postgresql must be a writable directory: mount a tmpfs owned by uid $(id -u) there"
	fi
	chmod 0700 "$PGDATA"
	chmod 0755 /var/run/postgresql
	if [[ $template == use ]]; then
		sb_start_from_template "$@"
	fi

	# Superuser postgres without a password: peer on the Unix socket only.
	local -a initdb_args=(--username=postgres --auth-local=peer --auth-host=scram-sha-256)
	if ((existing)); then
		log "sandbox mode: reusing the database cluster in $PGDATA (SANDBOXD_PERSISTENT=1)"
		# what a start killed right after moving PG_VERSION into place left
		rm -rf "$PGDATA/.sandboxd-initdb"
	elif [[ $persistent == 1 ]]; then
		sb_initdb_persistent "${initdb_args[@]}"
	else
		log "sandbox mode: initialising database cluster in $PGDATA"
		# --no-sync: the cluster lives on a throwaway tmpfs, which counts
		# against the container's memory: 1 MB WAL segments, and as few kept
		# as the server allows (a kept cluster's defaults stay).
		initdb "${initdb_args[@]}" --no-sync --wal-segsize=1 \
			-c min_wal_size=2MB -c max_wal_size=16MB >&2
	fi
	# Every start, so that a kept cluster has this image's rules too.
	sb_write_hba

	# Temporary server: the container's postgres arguments, then Unix socket only.
	local -a tmp_opts=("${@:2}" -c "listen_addresses=" -p 5432)
	pg_ctl -D "$PGDATA" -w -o "$(printf '%q ' "${tmp_opts[@]}")" start >&2

	export PGUSER=postgres PGHOST=/var/run/postgresql PGPORT=5432
	local -a psql_su=(psql -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=terse -v SHOW_CONTEXT=never --no-password)
	# A kept cluster may already have the role and the database (a fresh
	# one has neither); database postgres is out of the agent's reach.
	local have_role=f have_db=f
	if ((existing)); then
		have_role=$("${psql_su[@]}" -d postgres -At -c "SELECT count(*) > 0 FROM pg_catalog.pg_roles WHERE rolname = '$user'")
		have_db=$("${psql_su[@]}" -d postgres -At -c "SELECT count(*) > 0 FROM pg_catalog.pg_database WHERE datname = '$db'")
	fi
	local role_sql='CREATE ROLE "%s"'
	if [[ $have_role == t ]]; then role_sql='ALTER ROLE "%s" WITH'; fi
	# A template's role has no password (no login works until a sandbox
	# started from it sets one).
	local password_sql="PASSWORD NULL"
	if [[ $template != build ]]; then password_sql="PASSWORD '$sb_password'"; fi
	# One session; nothing it runs may log or show the statement that holds
	# the password (whatever the container's postgres arguments say).
	if ! {
		printf '%s\n' \
			"SET log_statement = 'none';" \
			"SET log_min_error_statement = 'panic';" \
			"SET log_min_duration_statement = -1;" \
			"SET log_min_duration_sample = -1;" \
			"SET log_transaction_sample_rate = 0;" \
			"SET debug_print_parse = off;" \
			"SET debug_print_rewritten = off;" \
			"SET debug_print_plan = off;" \
			"SET track_activities = off;" \
			"SET password_encryption = 'scram-sha-256';"
		# shellcheck disable=SC2059 # role_sql is one of the two formats above
		printf "$role_sql"' LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT %s;\n' \
			"$user" "$password_sql"
		printf '%s\n' "RESET track_activities;"
		if [[ $have_db != t ]]; then printf '%s\n' "CREATE DATABASE \"$db\" OWNER \"$user\";"; fi
		printf '%s\n' "REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;"
	} | "${psql_su[@]}" -d postgres >&2; then
		sb_password= password_sql=
		sb_stop_tmp
		sb_die 1 "creating role $user and database $db failed"
	fi
	sb_password= password_sql=
	if [[ $have_db != t ]]; then
		"${psql_su[@]}" -d "$db" -c "ALTER SCHEMA public OWNER TO \"$user\";" >&2
	fi
	if [[ $have_db == t ]]; then
		sb_kept_features "${feats[@]}"
	else
		for f in "${feats[@]}"; do
			if ! err=$("${psql_su[@]}" -d "$db" -c "CREATE EXTENSION IF NOT EXISTS \"$f\" CASCADE;" 2>&1 >/dev/null); then
				sb_feature_failed "$f" "$err"
			fi
			log "sandbox mode: extension $f created in $db"
		done
	fi

	if [[ $persistent != 1 ]]; then
		# Density: a throwaway cluster on tmpfs counts against the
		# container's memory. Its `postgres` database (~7.5 MB) is out of
		# the agent's reach anyway (CONNECT revoked above) and nothing of
		# sandbox mode uses it; template0 and template1 stay (CREATE
		# DATABASE needs them).
		"${psql_su[@]}" -d "$db" -c "DROP DATABASE postgres;" >&2
	fi
	pg_ctl -D "$PGDATA" -m fast -w stop >&2
	unset PGUSER PGHOST PGPORT
	if [[ $persistent != 1 ]]; then
		# Density: the WAL initdb and the set-up wrote (several 1 MB
		# segments kept for reuse) is of no use to a cluster that was shut
		# down cleanly; one segment stays.
		pg_resetwal -D "$PGDATA" >&2
	fi
	if [[ $template == build ]]; then
		# What the template was made for; a start from it must ask for the same.
		printf '%s\n' "$(sb_template_stamp)" >"$PGDATA/$SB_STAMP"
		sync -f "$PGDATA"
		mv "$PGDATA" "$SB_TEMPLATE/cluster"
		sync -f "$SB_TEMPLATE"
		log "sandbox mode: template of role $user, database $db${features:+, features $features} built"
		exit 0
	fi
	log "sandbox mode: role $user, database $db${features:+, features $features}; ready for start up."
	exec "$@" </dev/null
}

# Where the template volume is mounted (its cluster is in `cluster`), and
# the file in the cluster naming what the template was made for.
SB_TEMPLATE=/var/lib/postgresql/template
SB_STAMP=.sandboxd-template

# sb_template_build_start: exits 0 if the volume holds this template
# already; otherwise clears what an interrupted build left.
sb_template_build_start() {
	local stamp
	if [[ ! -d $SB_TEMPLATE || ! -w $SB_TEMPLATE ]]; then
		sb_die 64 "SANDBOXD_TEMPLATE=build needs a writable named volume on $SB_TEMPLATE"
	fi
	if [[ -f $SB_TEMPLATE/cluster/$SB_STAMP ]]; then
		stamp=$(<"$SB_TEMPLATE/cluster/$SB_STAMP")
		if [[ $stamp == "$(sb_template_stamp)" ]]; then
			log "sandbox mode: the template is built already"
			exit 0
		fi
		sb_die 64 "the volume on $SB_TEMPLATE holds a template for ${stamp:0:300}, not for $(sb_template_stamp): use one volume per template"
	fi
	rm -rf "$SB_TEMPLATE/.build" "$SB_TEMPLATE/cluster"
	mkdir -m 0700 "$SB_TEMPLATE/.build"
}

sb_template_stamp() { printf 'user=%s database=%s features=%s' "$user" "$db" "$features"; }

# sb_write_hba: the superuser only on the Unix socket (peer), every other
# role with a password over TCP, no replication.
sb_write_hba() {
	cat >"$PGDATA/pg_hba.conf" <<-'EOF'
		# sandboxd sandbox mode: the superuser only on the Unix socket (peer),
		# every other role with a password over TCP, no replication.
		# TYPE  DATABASE  USER      ADDRESS  METHOD
		local   all       all                peer
		host    all       postgres  all      reject
		host    all       all       all      scram-sha-256
	EOF
}

# sb_start_from_template POSTGRES ARGS...: copies the image's template
# cluster into the empty $PGDATA, sets the role's password in single-user
# mode (the statement reaches postgres on a pipe and is never logged), then
# execs the server. The template's role has no password: only the one set
# here logs in.
sb_start_from_template() {
	local stamp err
	if [[ ! -f $SB_TEMPLATE/cluster/$SB_STAMP ]]; then
		sb_die 64 "SANDBOXD_TEMPLATE=use, but no template is mounted on $SB_TEMPLATE: mount a volume that SANDBOXD_TEMPLATE=build filled"
	fi
	stamp=$(<"$SB_TEMPLATE/cluster/$SB_STAMP")
	if [[ $stamp != "$(sb_template_stamp)" ]]; then
		sb_die 64 "the mounted template was made for ${stamp:0:300}, but the container asks for $(sb_template_stamp): mount the template made for these features"
	fi
	# tar, not cp: several times faster for a cluster's many small files.
	tar -C "$SB_TEMPLATE/cluster" --exclude="./$SB_STAMP" -cf - . | tar -C "$PGDATA" -xf -
	sb_write_hba
	if ! err=$(printf 'ALTER ROLE "%s" WITH PASSWORD '\''%s'\'';\n' "$user" "$sb_password" |
		postgres --single -D "$PGDATA" "${@:2}" -c log_statement=none \
			-c log_min_error_statement=panic -c password_encryption=scram-sha-256 \
			"$db" 2>&1 >/dev/null) || [[ $err == *ERROR* || $err == *FATAL* ]]; then
		sb_password=
		sb_die 1 "setting the password of role $user in the template's copy failed: ${err//$'\n'/ }"
	fi
	sb_password=
	log "sandbox mode: role $user, database $db${features:+, features $features} from the template; ready for start up."
	exec "$@" </dev/null
}

# sb_feature_failed FEATURE ERROR: stop the temporary server, exit 65.
sb_feature_failed() {
	local err=$2
	err=${err#psql:*: }
	err=${err#ERROR:  }
	sb_stop_tmp
	sb_die 65 "feature \"$1\" is not available in this image: ${err//$'\n'/ }"
}

# sb_initdb_persistent INITDB_ARGS...: a fresh cluster on an empty named
# volume, crash-safe: initdb (with fsync) into $PGDATA/.sandboxd-initdb,
# which gets a file .complete when initdb succeeded, then every entry is
# renamed into $PGDATA, PG_VERSION last. A container killed on the way
# leaves either no PG_VERSION in $PGDATA (the next start removes an
# incomplete staging directory or finishes the renames) or a whole cluster.
sb_initdb_persistent() {
	local stage=$PGDATA/.sandboxd-initdb e
	local -a left=()
	if [[ -e $stage/.complete ]]; then
		log "sandbox mode: finishing an initialisation of $PGDATA that was interrupted"
	else
		rm -rf "$stage"
		shopt -s nullglob dotglob
		for e in "$PGDATA"/*; do
			# a file system's own lost+found does not count
			[[ ${e##*/} == lost+found ]] || left+=("$e")
		done
		shopt -u nullglob dotglob
		if ((${#left[@]})); then
			sb_die 64 "$PGDATA holds files but no cluster: mount an empty named volume (sandbox mode never deletes what it did not create)"
		fi
		log "sandbox mode: initialising database cluster in $PGDATA (SANDBOXD_PERSISTENT=1, kept)"
		initdb "$@" -D "$stage" >&2
		: >"$stage/.complete"
		sync "$stage/.complete" "$stage"
	fi
	shopt -s nullglob
	for e in "$stage"/*; do
		[[ ${e##*/} == PG_VERSION ]] || mv -f "$e" "$PGDATA/"
	done
	shopt -u nullglob
	sync "$PGDATA"
	mv -f "$stage/PG_VERSION" "$PGDATA/PG_VERSION"
	sync "$PGDATA"
	rm -rf "$stage"
}

# sb_kept_features FEATURE...: on a kept cluster, creates the features that
# are missing. The agent has owned schema public (and could create others)
# since the first start, so an extension's script must not see its objects
# (a script run by the superuser that resolves a name to an object the agent
# planted runs the agent's code as superuser): every session sets
# search_path=pg_catalog,pg_temp at connection (over the database's own
# settings, which the agent owns), each missing extension is created in
# schema sandboxd_features owned by postgres (its script then sees only
# that schema and pg_catalog), and the relocatable ones are moved to public
# afterwards (no script runs). A non-relocatable one (postgis) stays in
# sandboxd_features, which the database's search_path then includes.
sb_kept_features() {
	local f err missing=()
	local -a psql_db=(env "PGOPTIONS=-c search_path=pg_catalog,pg_temp" "${psql_su[@]}" -d "$db")
	for f in "$@"; do
		if [[ "$("${psql_db[@]}" -At -c "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = '$f'")" == 0 ]]; then
			missing+=("$f")
		fi
	done
	((${#missing[@]})) || return 0
	if ! err=$("${psql_db[@]}" 2>&1 >/dev/null <<-'EOSQL'
		DO $$
		BEGIN
		  IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace
		             WHERE nspname = 'sandboxd_features' AND nspowner <> 'postgres'::pg_catalog.regrole) THEN
		    RAISE EXCEPTION 'schema sandboxd_features exists but is not owned by postgres';
		  END IF;
		END
		$$;
		CREATE SCHEMA IF NOT EXISTS sandboxd_features AUTHORIZATION postgres;
	EOSQL
	); then
		err=${err#psql:*: }
		err=${err#ERROR:  }
		sb_stop_tmp
		sb_die 65 "feature(s) ${missing[*]} cannot be created in the kept cluster: ${err//$'\n'/ }"
	fi
	for f in "${missing[@]}"; do
		if ! err=$("${psql_db[@]}" -c "CREATE EXTENSION IF NOT EXISTS \"$f\" SCHEMA sandboxd_features CASCADE;" 2>&1 >/dev/null); then
			sb_feature_failed "$f" "$err"
		fi
		log "sandbox mode: extension $f created in $db (kept cluster)"
	done
	if ! err=$("${psql_db[@]}" 2>&1 >/dev/null <<-'EOSQL'
		SELECT pg_catalog.format('ALTER EXTENSION %I SET SCHEMA public', e.extname)
		FROM pg_catalog.pg_extension e
		WHERE e.extnamespace = 'sandboxd_features'::pg_catalog.regnamespace AND e.extrelocatable
		  AND EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'public')
		\gexec
		DO $$
		BEGIN
		  IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension
		             WHERE extnamespace = 'sandboxd_features'::pg_catalog.regnamespace) THEN
		    GRANT USAGE ON SCHEMA sandboxd_features TO PUBLIC;
		    EXECUTE pg_catalog.format('ALTER DATABASE %I SET search_path = "$user", public, sandboxd_features',
		                              pg_catalog.current_database());
		  ELSE
		    DROP SCHEMA sandboxd_features;
		  END IF;
		END
		$$;
	EOSQL
	); then
		sb_feature_failed "${missing[0]}" "$err"
	fi
}

if [[ "${SANDBOXD_SANDBOX:-}" == 1 ]]; then
	sandbox_main "$@"
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
