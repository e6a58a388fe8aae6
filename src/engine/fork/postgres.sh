# sandboxd's fork copy for PostgreSQL, run with `docker exec` as the
# image's user in the source itself (OP flush) or in a helper container
# that shares the source's PID namespace (OP copy), with the fork's copy
# volume at TARGET; in both the postmaster is pid 1, so the source's files
# are under /proc/1/root: bash -c SCRIPT sandboxd-fork OP DATA TARGET
#   OP flush  (the source running) a CHECKPOINT, as the bootstrap superuser
#             on the source's Unix socket (peer authentication: the same
#             uid): the source commits asynchronously, so a commit it has
#             answered may still be in its WAL buffers, in memory; after
#             this every one is in the WAL files, and few pages are left
#             for the fork's recovery to replay
#   OP copy   (the source frozen, `docker pause`) copies the source's data
#             directory DATA into TARGET/cluster
#
# Every process of the source is frozen during the copy, so the files are
# what a crash at that moment would leave: the fork's first start recovers
# them from the WAL as after a crash (the WAL is written before the pages
# it describes, whatever fsync says; frozen processes write nothing). The
# copy is built aside and renamed into place last, with the stamp the
# image's template start checks (SANDBOXD_USER, SANDBOXD_DATABASE and
# SANDBOXD_FEATURES of the fork's container, in the exec's environment),
# and prints size=<bytes>.
set -euo pipefail
op=$1 data=/proc/1/root$2 target=$3
if [[ $op == flush ]]; then
	# An absolute symbolic link under /proc/1/root (/var/run -> /run)
	# resolves in this container's root, not pid 1's: the path is resolved
	# here first (the same image).
	PGOPTIONS='-c client_min_messages=warning' psql -X -q -At -v ON_ERROR_STOP=1 --no-password \
		-h "/proc/1/root$(readlink -f /var/run/postgresql)" -U postgres -d template1 -c CHECKPOINT
	exit
fi
if [[ $op != copy ]]; then
	echo "unknown operation $op" >&2
	exit 64
fi
if [[ ! -r $data/PG_VERSION ]]; then
	echo "the source's data directory is not readable at $data: is the source's postmaster pid 1 of its container, running as uid $(id -u)?" >&2
	exit 1
fi
rm -rf "$target/.build" "$target/cluster"
mkdir -m 0700 "$target/.build"
# What a server writes about itself when it starts (the fork's own start
# writes its own); the rest is the cluster.
tar -C "$data" --exclude=./postmaster.pid --exclude=./postmaster.opts \
	--exclude='./pg_stat_tmp/*' -cf - . | tar -C "$target/.build" -xf -
printf 'user=%s database=%s features=%s' \
	"$SANDBOXD_USER" "$SANDBOXD_DATABASE" "${SANDBOXD_FEATURES:-}" >"$target/.build/.sandboxd-template"
mv "$target/.build" "$target/cluster"
echo "size=$(du -sb "$target/cluster" | cut -f1)"
