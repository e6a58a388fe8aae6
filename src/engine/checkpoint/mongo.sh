# sandboxd's checkpoints and resets for MongoDB, run with `docker exec`
# inside the container as its user, as the agent's own login (its password
# read from the tmpfs file the shim wrote, handed to the tools in a config
# file on /tmp, never in an argument): bash -c SCRIPT sandboxd-checkpoint OP DB USER NAME
#   OP size        prints size=<bytes> of DB (dataSize)
#   OP checkpoint  mongodump of DB to /data/db/sandboxd-checkpoints/NAME.archive
#   OP reset       drops DB, then (unless NAME is baseline) mongorestore of
#                  that archive
# The agent's login cannot end other sessions: a reset does not close them.
# NAME is validated by sandboxd (a-z 0-9 _ -).
set -euo pipefail
op=$1 db=$2 user=$3 name=$4
dir=/data/db/sandboxd-checkpoints
file=$dir/$name.archive
umask 077
conf=$(mktemp /tmp/sandboxd-tools.XXXXXX)
trap 'rm -f "$conf"' EXIT
printf 'password: "%s"\n' "$(cat /run/sandboxd/password)" >"$conf"
tools=(--host 127.0.0.1 --port 27017 --username "$user" --authenticationDatabase admin --config "$conf" --quiet)
shell() {
	mongosh --quiet --host 127.0.0.1 --eval '
		const name = process.env.SANDBOXD_DATABASE;
		db.getSiblingDB("admin").auth(process.env.SANDBOXD_USER, fs.readFileSync("/run/sandboxd/password", "utf8"));
		const d = db.getSiblingDB(name);
		'"$1"
}
case $op in
size)
	shell 'print("size=" + d.stats().dataSize)'
	;;
checkpoint)
	mkdir -p "$dir"
	mongodump "${tools[@]}" --db "$db" --archive="$file.tmp"
	mv -f "$file.tmp" "$file"
	echo "size=$(stat -c %s "$file")"
	;;
reset)
	if [[ $name != baseline && ! -f $file ]]; then
		echo "checkpoint $name is not in this container: it was re-created since; take the checkpoint again" >&2
		exit 1
	fi
	shell 'd.dropDatabase()' >/dev/null
	if [[ $name != baseline ]]; then
		mongorestore "${tools[@]}" --nsInclude "$db.*" --archive="$file"
	fi
	echo reset
	;;
*)
	echo "unknown operation $op" >&2
	exit 64
	;;
esac
