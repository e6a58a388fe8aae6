# sandboxd's checkpoints and resets for Redis and Valkey, run with `docker
# exec` inside the container as its user, which logs in as the image's
# admin user `sandboxd-admin` (password in /run/sandboxd/admin, written by
# the entrypoint; the agent's `default` user has no SAVE, DEBUG or CONFIG
# SET): sh -c SCRIPT sandboxd-checkpoint OP NAME
#   OP size        prints size=<bytes> of the data set (an RDB file is smaller)
#   OP checkpoint  SAVE (atomic: the server blocks), the file becomes
#                  /data/sandboxd-checkpoint-NAME.rdb, prints size=<bytes>
#   OP reset       baseline: FLUSHALL; NAME: DEBUG RELOAD NOSAVE of a hard
#                  link of that file (the data set is replaced at once),
#                  then every client's session is closed
# NAME is validated by sandboxd (a-z 0-9 _ -).
set -u
op=$1 name=$2
fail() {
	printf '%s\n' "$1" >&2
	exit 1
}
cli=$(command -v valkey-cli || command -v redis-cli) || fail "neither valkey-cli nor redis-cli is in the image"
[ -r /run/sandboxd/admin ] || fail "the image has no admin login (/run/sandboxd/admin): rebuild it with deploy/images/build.sh; checkpoints need sandboxd's images of December 2026 or later"
REDISCLI_AUTH=$(cat /run/sandboxd/admin)
export REDISCLI_AUTH
r() { "$cli" --no-auth-warning --user sandboxd-admin -h 127.0.0.1 -p 6379 "$@"; }
file=/data/sandboxd-checkpoint-$name.rdb
case $op in
size)
	r info memory | sed -n 's/^used_memory_dataset:\([0-9]*\).*/size=\1/p'
	;;
checkpoint)
	rm -f /data/dump.rdb
	out=$(r save) || fail "SAVE failed: $out"
	[ "$out" = OK ] || fail "SAVE answered: $out"
	mv -f /data/dump.rdb "$file" || fail "could not keep the snapshot as $file"
	echo "size=$(stat -c %s "$file")"
	;;
reset)
	if [ "$name" = baseline ]; then
		out=$(r flushall sync)
		[ "$out" = OK ] || fail "FLUSHALL answered: $out"
	else
		[ -f "$file" ] || fail "checkpoint $name is not in this container: it was re-created since (a heal starts with empty data); take the checkpoint again"
		ln -f "$file" /data/dump.rdb || fail "could not link $file"
		out=$(r debug reload nosave)
		rm -f /data/dump.rdb
		[ "$out" = OK ] || fail "DEBUG RELOAD answered: $out"
	fi
	r client kill type normal >/dev/null
	r client kill type pubsub >/dev/null
	if [ "$(r config get appendonly | tail -n 1)" = yes ]; then
		# A persistent sandbox's append-only file follows the new data.
		r bgrewriteaof >/dev/null
	fi
	echo reset
	;;
*)
	fail "unknown operation $op"
	;;
esac
