#!/bin/sh
# Entrypoint of sandboxd/valkey:8, compatible with the official valkey image
# (and with sandboxd/redis:7's). Started as root it only gives /data to the
# valkey user (CAP_CHOWN, needed only when /data is not already valkey's, e.g.
# a fresh tmpfs) and drops to that user (CAP_SETUID, CAP_SETGID).
set -eu

# first arg is `-f` or `--some-option`, or a `something.conf` file
first=${1:-}
if [ "${first#-}" != "$first" ] || [ "${first%.conf}" != "$first" ]; then
	set -- valkey-server "$@"
fi

if [ "${1:-}" = valkey-server ]; then
	# The official image builds valkey-server with protected mode off by
	# default, because it runs without a config file; Debian's binary
	# defaults to on. Turn it off unless the arguments or the given config
	# file say otherwise.
	shift
	conf=
	case "${1:-}" in -*|'') ;; *) conf=$1; shift ;; esac
	want_off=1
	for a in "$@"; do
		case "$a" in --protected-mode|--protected-mode=*) want_off=0 ;; esac
	done
	if [ -n "$conf" ] && [ -r "$conf" ] && grep -qiE '^[[:space:]]*protected-mode[[:space:]]' "$conf"; then
		want_off=0
	fi
	if [ "$want_off" = 1 ]; then
		set -- --protected-mode no "$@"
	fi
	if [ -n "$conf" ]; then
		set -- "$conf" "$@"
	fi
	set -- valkey-server "$@"

	# allow the container to be started with `--user`
	if [ "$(id -u)" = 0 ]; then
		if [ "$(stat -c %u .)" != "$(id -u valkey)" ]; then
			chown valkey:valkey . || echo "warning: cannot chown $(pwd) to valkey (no CAP_CHOWN?): saving will fail unless it is writable by uid $(id -u valkey)" >&2
		fi
		find . -mindepth 1 \! -user valkey -exec chown valkey '{}' + 2>/dev/null || :
		export HOME=/data USER=valkey LOGNAME=valkey
		exec setpriv --reuid=valkey --regid=valkey --init-groups -- "$0" "$@"
	fi

	# set an appropriate umask (if one isn't set already)
	if [ "$(umask)" = 0022 ]; then
		umask 0077
	fi
fi

exec "$@"
