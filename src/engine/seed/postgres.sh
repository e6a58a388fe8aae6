# Loads a seed into the agent's database, next to the engine: run by
# sandboxd inside the engine's container as
#   bash -c SCRIPT sandboxd-seed KIND PORT USER DATABASE TIMEOUT
# with the agent's password on the first line of standard input and the
# seed after it, streamed:
#   KIND sql      SQL text, framed by sandboxd: psql's restricted mode
#                 first, a marker query last. psql runs it in one
#                 transaction, reading it as a file (`--file=-`: its
#                 errors name the line); query results go nowhere but
#                 their last bytes, where the marker is when psql got that
#                 far;
#   KIND archive  a pg_dump custom-format archive, restored in one
#                 transaction, leaving out what needs another role.
# Each statement runs under TIMEOUT seconds unless the seed sets its own
# (sandboxd bounds the whole). Both log in as the agent over TCP (the
# superuser exists only on the Unix socket), so a seed can do what the
# agent can and nothing more. The password is written to a password file
# private to this script (never an argument or an environment variable),
# removed on exit.
set -euo pipefail
kind=$1 port=$2 user=$3 db=$4 timeout=$5
umask 077
IFS= read -r password
passfile=$(mktemp)
trap 'rm -f "$passfile"' EXIT
# host:port:database:user:password; `:` and `\` in the password escaped.
printf '*:*:*:*:%s\n' "$(printf '%s' "$password" | sed 's/[\\:]/\\&/g')" >"$passfile"
unset password
export PGPASSFILE=$passfile PGCONNECT_TIMEOUT=10 PGAPPNAME=sandboxd-seed \
	PGOPTIONS="-c statement_timeout=${timeout}s"
login=(--host=127.0.0.1 --port="$port" --username="$user" --dbname="$db" --no-password)
case $kind in
sql)
	psql --no-psqlrc --quiet --tuples-only --no-align --single-transaction \
		--set=ON_ERROR_STOP=1 --file=- "${login[@]}" | tail -c 256
	;;
archive)
	pg_restore --single-transaction --exit-on-error --no-owner --no-privileges \
		--no-tablespaces --no-security-labels --no-publications --no-subscriptions \
		"${login[@]}"
	;;
*)
	echo "unknown seed kind $kind" >&2
	exit 64
	;;
esac
