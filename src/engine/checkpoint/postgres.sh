# sandboxd's checkpoints and resets for PostgreSQL, run with `docker exec`
# inside the container as its user, which logs in as the bootstrap
# superuser `postgres` on the Unix socket (peer authentication; no password
# exists): bash -c SCRIPT sandboxd-checkpoint OP DB OWNER NAME
#   OP size        prints size=<bytes> of the agent's database DB
#   OP checkpoint  closes DB's sessions, copies DB to the template database
#                  sandboxd_checkpoint_NAME (no login may open it), prints
#                  size=<bytes> of the copy
#   OP baseline    as checkpoint, as NAME baseline, unless it exists (a kept
#                  cluster of a persistent sandbox has it from its first start)
#   OP reset       closes DB's sessions, sets DB aside, copies the
#                  checkpoint to DB owned by OWNER, then drops what was set
#                  aside (or puts it back on a failure)
# NAME is validated by sandboxd (a-z 0-9 _ -); every name reaches SQL as a
# psql variable, quoted by psql (:"var", :'var').
set -uo pipefail
op=$1 db=$2 owner=$3 name=$4
ck=sandboxd_checkpoint_$name
aside=sandboxd_reset_aside
export PGOPTIONS='-c client_min_messages=warning'
psql=(psql -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=terse --no-password -h /var/run/postgresql -U postgres -d template1
	-v db="$db" -v ck="$ck" -v owner="$owner" -v aside="$aside")
run() { "${psql[@]}"; }
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
case $op in
size)
	run <<-'SQL'
		SELECT 'size=' || pg_catalog.pg_database_size(:'db');
	SQL
	;;
baseline)
	found=$(
		run <<-'SQL'
			SELECT count(*) FROM pg_catalog.pg_database WHERE datname = :'ck';
		SQL
	) || exit 1
	if [[ $found == 1 ]]; then
		exit 0
	fi
	exec bash -c "$BASH_EXECUTION_STRING" sandboxd-checkpoint checkpoint "$db" "$owner" "$name"
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
	# The agent's database is set aside (not dropped) until its copy of
	# the checkpoint exists; on a failure it comes back.
	found=$(
		run <<-'SQL'
			SELECT count(*) FROM pg_catalog.pg_database WHERE datname = :'ck';
			DROP DATABASE IF EXISTS :"aside";
		SQL
	) || exit 1
	if [[ $found != 1 ]]; then
		echo "checkpoint $name is not in this container: it was re-created since (a heal starts with empty data); take the checkpoint again" >&2
		exit 1
	fi
	close_sessions || { open_sessions; exit 1; }
	if ! run <<-'SQL'; then
		ALTER DATABASE :"db" RENAME TO :"aside";
	SQL
		open_sessions
		exit 1
	fi
	if ! run <<-'SQL'; then
		CREATE DATABASE :"db" TEMPLATE :"ck" OWNER :"owner" STRATEGY FILE_COPY;
	SQL
		run <<-'SQL'
			ALTER DATABASE :"aside" RENAME TO :"db";
			ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS true;
		SQL
		exit 1
	fi
	run <<-'SQL'
		DROP DATABASE :"aside";
	SQL
	echo reset
	;;
*)
	echo "unknown operation $op" >&2
	exit 64
	;;
esac
