# sandboxd's checkpoints and resets for PostgreSQL, run with `docker exec`
# inside the container as its user, which logs in as the bootstrap
# superuser `postgres` on the Unix socket (peer authentication; no password
# exists): bash -c SCRIPT sandboxd-checkpoint OP DB OWNER NAME
#   OP size        prints size=<bytes> of the agent's database DB
#   OP checkpoint  closes DB's sessions, copies DB to the template database
#                  sandboxd_checkpoint_NAME (no login may open it), prints
#                  size=<bytes> of the copy
#   OP baseline    records how to make DB as provisioned: its features (the
#                  extensions, with their schemas and versions) as SQL in
#                  $PGDATA/sandboxd-baseline.sql, unless that exists (a kept
#                  cluster of a persistent sandbox has it from its first
#                  start). A few hundred bytes, where a copy of the empty
#                  database would take 7.5 MiB of the sandbox's memory.
#   OP reset       closes DB's sessions, sets DB aside, makes DB again owned
#                  by OWNER (a copy of the checkpoint; for NAME baseline a
#                  new database from template0 with the recorded features),
#                  then drops what was set aside (or puts it back on a failure)
# NAME is validated by sandboxd (a-z 0-9 _ -); every name reaches SQL as a
# psql variable, quoted by psql (:"var", :'var').
set -uo pipefail
op=$1 db=$2 owner=$3 name=$4
ck=sandboxd_checkpoint_$name
aside=sandboxd_reset_aside
baseline=${PGDATA:?PGDATA is not set in the container}/sandboxd-baseline.sql
# No notices; and a session in the agent's database resolves no name to an
# object the agent planted (search_path over the database's own settings).
export PGOPTIONS='-c client_min_messages=warning -c search_path=pg_catalog,pg_temp'
psql=(psql -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=terse --no-password -h /var/run/postgresql -U postgres
	-v db="$db" -v ck="$ck" -v owner="$owner" -v aside="$aside")
run() { "${psql[@]}" -d template1 "$@"; }
# Closes every session on the agent's database and keeps new ones out.
close_sessions() {
	run <<-'SQL'
		ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS false;
		SELECT count(pg_catalog.pg_terminate_backend(pid, 5000)) AS closed FROM pg_catalog.pg_stat_activity
		WHERE datname = :'db' AND pid <> pg_catalog.pg_backend_pid() \gset
	SQL
}
open_sessions() {
	run <<-'SQL'
		ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS true;
	SQL
}
# Makes DB anew from the recorded baseline: an empty database owned by
# OWNER with the features it was provisioned with.
make_baseline() {
	run <<-'SQL' || return 1
		CREATE DATABASE :"db" TEMPLATE template0 OWNER :"owner";
	SQL
	{
		printf '%s\n' 'ALTER SCHEMA public OWNER TO :"owner";'
		cat "$baseline"
	} | "${psql[@]}" -d "$db"
}
case $op in
size)
	run <<-'SQL'
		SELECT 'size=' || pg_catalog.pg_database_size(:'db');
	SQL
	;;
baseline)
	if [[ -s $baseline ]]; then
		exit 0
	fi
	umask 077
	"${psql[@]}" -d "$db" >"$baseline.tmp" <<-'SQL' || exit 1
		SELECT pg_catalog.format('CREATE SCHEMA IF NOT EXISTS %I; GRANT USAGE ON SCHEMA %I TO PUBLIC;', n.nspname, n.nspname)
		FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
		WHERE n.nspname NOT IN ('public', 'pg_catalog') GROUP BY n.nspname ORDER BY n.nspname;
		SELECT pg_catalog.format('CREATE EXTENSION IF NOT EXISTS %I SCHEMA %I VERSION %L CASCADE;', e.extname, n.nspname, e.extversion)
		FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
		WHERE e.extname <> 'plpgsql' ORDER BY e.oid;
	SQL
	# Never empty once written: a new database needs no statement at all.
	printf '%s\n' 'SELECT 1;' >>"$baseline.tmp"
	mv -f "$baseline.tmp" "$baseline"
	echo "size=$(stat -c %s "$baseline")"
	;;
checkpoint)
	# A file-level copy of the live database (it needs no session on it),
	# then closed to every login: only a reset uses it.
	close_sessions || { open_sessions; exit 1; }
	run <<-'SQL'
		DROP DATABASE IF EXISTS :"ck";
		CREATE DATABASE :"ck" TEMPLATE :"db" STRATEGY FILE_COPY;
		ALTER DATABASE :"ck" WITH ALLOW_CONNECTIONS false;
		SELECT 'size=' || pg_catalog.pg_database_size(:'ck');
	SQL
	rc=$?
	open_sessions || rc=1
	exit $rc
	;;
reset)
	if [[ $name == baseline ]]; then
		if [[ ! -s $baseline ]]; then
			echo "no baseline was recorded in this container ($baseline)" >&2
			exit 1
		fi
	else
		found=$(
			run <<-'SQL'
				SELECT count(*) FROM pg_catalog.pg_database WHERE datname = :'ck';
			SQL
		) || exit 1
		if [[ $found != 1 ]]; then
			echo "checkpoint $name is not in this container: it was re-created since (a heal starts with empty data); take the checkpoint again" >&2
			exit 1
		fi
	fi
	run <<-'SQL' || exit 1
		DROP DATABASE IF EXISTS :"aside";
	SQL
	# The agent's database is set aside (not dropped) until its new copy
	# exists; on a failure it comes back. Three psql sessions in all (each
	# costs a process and a login).
	if ! run <<-'SQL'; then
		ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS false;
		SELECT count(pg_catalog.pg_terminate_backend(pid, 5000)) AS closed FROM pg_catalog.pg_stat_activity
		WHERE datname = :'db' AND pid <> pg_catalog.pg_backend_pid() \gset
		ALTER DATABASE :"db" RENAME TO :"aside";
	SQL
		open_sessions
		exit 1
	fi
	if [[ $name == baseline ]]; then
		make_baseline && run <<-'SQL'
			DROP DATABASE :"aside";
		SQL
	else
		run <<-'SQL'
			CREATE DATABASE :"db" TEMPLATE :"ck" OWNER :"owner" STRATEGY FILE_COPY;
			DROP DATABASE :"aside";
		SQL
	fi
	made=$?
	if ((made != 0)); then
		run <<-'SQL'
			SELECT EXISTS (SELECT FROM pg_catalog.pg_database WHERE datname = :'aside') AS kept \gset
			\if :kept
			DROP DATABASE IF EXISTS :"db";
			ALTER DATABASE :"aside" RENAME TO :"db";
			\endif
			ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS true;
		SQL
		exit 1
	fi
	echo reset
	;;
*)
	echo "unknown operation $op" >&2
	exit 64
	;;
esac
