# sandboxd's checkpoints and resets for PostgreSQL, run with `docker exec`
# inside the container as its user, which logs in as the bootstrap
# superuser `postgres` on the Unix socket (peer authentication; no password
# exists): bash -c SCRIPT sandboxd-checkpoint OP DB OWNER NAME
#   OP size        prints size=<bytes> of the agent's database DB
#   OP checkpoint  closes DB's sessions, copies DB to the template database
#                  sandboxd_checkpoint_NAME (no login may open it), prints
#                  size=<bytes> of the copy
#   OP reset       closes DB's sessions, sets DB aside, makes DB again owned
#                  by OWNER (a copy of the checkpoint; for NAME baseline a
#                  new database from template0 with the container's
#                  features, SANDBOXD_FEATURES, as provisioning made it,
#                  closed to OWNER until they are in),
#                  then drops what was set aside (or puts it back on a failure)
# NAME is validated by sandboxd (a-z 0-9 _ -); every name reaches SQL as a
# psql variable, quoted by psql (:"var", :'var').
set -uo pipefail
op=$1 db=$2 owner=$3 name=$4
ck=sandboxd_checkpoint_$name
aside=sandboxd_reset_aside
# No notices; and a session in the agent's database resolves no name to an
# object the agent planted (search_path over the database's own settings).
export PGOPTIONS='-c client_min_messages=warning -c search_path=pg_catalog,pg_temp'
psql=(psql -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=terse --no-password -h /var/run/postgresql -U postgres
	-v db="$db" -v ck="$ck" -v owner="$owner" -v aside="$aside" -v features="${SANDBOXD_FEATURES:-}")
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
# Makes DB anew as provisioning made it: an empty database owned by OWNER,
# its schema public OWNER's, with the container's features (the image's
# sandbox mode created them the same way, in public), and drops ASIDE.
# The server listens on TCP meanwhile, so the database stays the
# superuser's and closed to every other role until the features are in:
# an extension's script runs as superuser and resolves names in public, so
# an agent that could connect in between could plant a function or an
# operator there for the script to call. It is created closed (no login at
# all), CONNECT is revoked from PUBLIC, and only then are logins allowed
# (the superuser's, the only role left with CONNECT). The agent gets the
# database, public and CONNECT back at the end, in the same session that
# created the features. Two psql sessions, as before the hand-over.
make_baseline() {
	run <<-'SQL' || return 1
		CREATE DATABASE :"db" TEMPLATE template0 OWNER postgres ALLOW_CONNECTIONS false;
		REVOKE CONNECT ON DATABASE :"db" FROM PUBLIC;
		ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS true;
	SQL
	"${psql[@]}" -d "$db" <<-'SQL'
		SELECT pg_catalog.format('CREATE EXTENSION IF NOT EXISTS %I SCHEMA public CASCADE', f)
		FROM pg_catalog.unnest(pg_catalog.string_to_array(:'features', ',')) AS f WHERE f <> '' \gexec
		ALTER SCHEMA public OWNER TO :"owner";
		ALTER DATABASE :"db" OWNER TO :"owner";
		GRANT CONNECT ON DATABASE :"db" TO PUBLIC;
		DROP DATABASE :"aside";
	SQL
}
case $op in
size)
	run <<-'SQL'
		SELECT 'size=' || pg_catalog.pg_database_size(:'db');
	SQL
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
	if [[ $name != baseline ]]; then
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
		make_baseline
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
