#!/bin/sh
# check-modules SERVER CLI: starts SERVER (redis-server or valkey-server) on a
# Unix socket with the three modules of this image loaded and fails unless
# `INFO modules` lists each under the name sandboxd checks for (ReJSON,
# search, bf). Run by the redis and valkey image builds; harmless to keep.
set -eu
server=$1 cli=$2
dir=/usr/lib/redis/modules
sock=/tmp/check-modules.sock
ls -l "$dir/rejson.so" "$dir/redisearch.so" "$dir/redisbloom.so"
"$server" --port 0 --save '' --appendonly no --loglevel warning \
	--loadmodule "$dir/rejson.so" \
	--loadmodule "$dir/redisearch.so" \
	--loadmodule "$dir/redisbloom.so" \
	--unixsocket "$sock" --daemonize yes --pidfile /tmp/check-modules.pid
i=0
while [ ! -S "$sock" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
modules=$("$cli" -s "$sock" INFO modules)
printf '%s\n' "$modules"
"$cli" -s "$sock" SHUTDOWN NOSAVE >/dev/null 2>&1 || :
rm -f "$sock" /tmp/check-modules.pid
for name in ReJSON search bf; do
	printf '%s\n' "$modules" | grep -q "^module:name=$name," || {
		echo "check-modules: $server did not load module $name" >&2
		exit 1
	}
done
