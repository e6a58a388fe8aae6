# sandboxd's fork copy for Redis and Valkey, run with `docker exec` in a
# helper container that shares the source's PID and network namespaces (the
# server is its pid 1, its files under /proc/1/root, its port on
# 127.0.0.1), as the image's user (the source's), with the fork's copy
# volume at TARGET: sh -c SCRIPT sandboxd-fork OP DATA TARGET
#   OP flush  nothing (the copy takes its own snapshot); run in the source
#   OP copy   SAVE, logged in as the image's admin user `sandboxd-admin`
#             (its password in the source's /run/sandboxd/admin; the agent's
#             user has no SAVE): the server writes its data set to
#             DATA/dump.rdb at once (the server blocks meanwhile, so the
#             file is one moment's data), which becomes TARGET/dump.rdb
#             (copied aside, renamed into place last) and is removed from
#             the source; prints size=<bytes>
# The fork's server loads TARGET/dump.rdb at its start (the images'
# SANDBOXD_TEMPLATE=use).
set -u
op=$1 data=/proc/1/root$2 target=$3
fail() {
	printf '%s\n' "$1" >&2
	exit 1
}
case $op in
flush) exit 0 ;;
copy) ;;
*)
	printf 'unknown operation %s\n' "$op" >&2
	exit 64
	;;
esac
cli=$(command -v valkey-cli || command -v redis-cli) || fail "neither valkey-cli nor redis-cli is in the image"
[ -r /proc/1/root/run/sandboxd/admin ] || fail "the source has no admin login (/run/sandboxd/admin): is its server pid 1 of its container, running as uid $(id -u), from sandboxd's images of December 2026 or later?"
REDISCLI_AUTH=$(cat /proc/1/root/run/sandboxd/admin)
export REDISCLI_AUTH
rm -f "$data/dump.rdb"
out=$("$cli" --no-auth-warning --user sandboxd-admin -h 127.0.0.1 -p 6379 save) || fail "SAVE failed: $out"
[ "$out" = OK ] || fail "SAVE answered: $out"
rm -f "$target/.build.rdb"
cp "$data/dump.rdb" "$target/.build.rdb" || fail "could not copy the snapshot"
rm -f "$data/dump.rdb"
mv -f "$target/.build.rdb" "$target/dump.rdb"
echo "size=$(stat -c %s "$target/dump.rdb")"
