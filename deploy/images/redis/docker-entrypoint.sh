#!/bin/sh
# Entrypoint of sandboxd/redis:8, compatible with the official image, and of
# sandboxd/valkey:8, which copies it from this image and sets RESP_SERVER and
# RESP_USER (the server binary and its user; redis-server and redis here).
# Started as root it only gives /data to that user (CAP_CHOWN, needed only
# when /data is not already the user's, e.g. a fresh tmpfs) and drops to that
# user (CAP_SETUID, CAP_SETGID).
#
# Sandbox mode (SANDBOXD_SANDBOX=1), see "Sandbox mode" in
# deploy/images/README.md: started as uid 999 (never root, no capability
# needed), reads KEY=VALUE lines from standard input until EOF (only
# SANDBOXD_PASSWORD, required), or from the file SANDBOXD_SECRETS_FILE names
# when it is set (a path under /run/secrets/, where Docker Swarm mounts a
# secret; standard input is then not read), writes /run/sandboxd/server.conf (mode 0600:
# port 6379 on all interfaces, no persistence, MODULE commands and
# protected configs disabled, DEBUG only from inside the container, one ACL
# user `default` with that password and no administrative commands (nor
# the loaded modules' administration, debug and raw-load commands), and
# sandboxd's admin user `sandboxd-admin` with a random password that only
# /run/sandboxd/admin holds, for checkpoints and resets run with `docker
# exec`) and execs `$RESP_SERVER /run/sandboxd/server.conf`
# with the container's arguments (e.g. --loadmodule PATH). With
# SANDBOXD_PERSISTENT=1 (/data is a named volume kept across containers of
# one sandbox) the data goes to an append-only file in /data instead
# (appendonly yes, appendfsync everysec) and is loaded again by the next
# container on that volume. With SANDBOXD_TEMPLATE=use, the server starts
# with the data of the RDB file /var/lib/sandboxd/template/dump.rdb (a
# fork's copy or a seed's file, in a volume mounted read-only there). Exit 64: bad input (stdin, environment, data or
# runtime dir, started as root). The password only ever
# lives in a shell variable and goes to the file through the printf builtin:
# it is never an argument of any program, never in the environment, never
# printed.
set -eu

server=${RESP_SERVER:-redis-server}
user=${RESP_USER:-redis}

# first arg is `-f` or `--some-option`, or a `something.conf` file
first=${1:-}
if [ "${first#-}" != "$first" ] || [ "${first%.conf}" != "$first" ]; then
	set -- "$server" "$@"
fi

case "${SANDBOXD_SANDBOX:-}" in
'' | 1) ;;
*)
	printf 'sandboxd: SANDBOXD_SANDBOX must be 1 (sandbox mode) or unset\n' >&2
	exit 64
	;;
esac

# ===========================================================================
# Sandbox mode. Runs as the user the container was started as; dash builtins
# only (read, printf, case, test) touch the password.
# ===========================================================================
if [ "${SANDBOXD_SANDBOX:-}" = 1 ] && [ "${1:-}" = "$server" ]; then
	shift
	keys=SANDBOXD_PASSWORD # the keys accepted on standard input
	rundir=/run/sandboxd
	conf=$rundir/server.conf
	sb_die() { # CODE MESSAGE
		printf 'sandboxd: %s\n' "$2" >&2
		exit "$1"
	}
	if [ "$(id -u)" = 0 ]; then
		sb_die 64 "sandbox mode never runs as root: start the container with --user 999:999"
	fi
	if [ -n "${SANDBOXD_PASSWORD+x}" ]; then
		sb_die 64 "SANDBOXD_PASSWORD is in the environment: in sandbox mode secrets are read from standard input or SANDBOXD_SECRETS_FILE only"
	fi

	# KEY=VALUE lines until EOF, from standard input or the secret file
	# (a function, so that its redirection keeps the variables it sets).
	from="standard input"
	pw= have=0 n=0
	read_secrets() {
		while IFS= read -r line || [ -n "$line" ]; do
			n=$((n + 1))
			[ -n "$line" ] || continue
			case "$line" in
			*=*) ;;
			*) line=; sb_die 64 "line $n of $from is not KEY=VALUE (allowed keys: $keys)" ;;
			esac
			key=${line%%=*}
			case "$key" in
			SANDBOXD_PASSWORD)
				[ "$have" = 0 ] || { line=; sb_die 64 "SANDBOXD_PASSWORD given twice on $from"; }
				pw=${line#*=}
				have=1
				;;
			*)
				line=
				# Name the key only when it looks like one: [A-Za-z0-9_]{1,64}
				# with a '_', which a password ([A-Za-z0-9]) never has.
				case "$key" in
				*[!A-Za-z0-9_]*) ;;
				*_*)
					if [ "${#key}" -le 64 ]; then
						sb_die 64 "unknown key $key on $from (allowed keys: $keys)"
					fi
					;;
				esac
				sb_die 64 "unknown key on line $n of $from (allowed keys: $keys)"
				;;
			esac
		done
	}
	secrets=${SANDBOXD_SECRETS_FILE:-}
	if [ -z "$secrets" ]; then
		read_secrets
	else
		case "$secrets" in
		*..*) sb_die 64 "SANDBOXD_SECRETS_FILE must name a file under /run/secrets/ (where Docker mounts secrets)" ;;
		/run/secrets/*) ;;
		*) sb_die 64 "SANDBOXD_SECRETS_FILE must name a file under /run/secrets/ (where Docker mounts secrets)" ;;
		esac
		if [ ! -f "$secrets" ] || [ ! -r "$secrets" ]; then
			sb_die 64 "SANDBOXD_SECRETS_FILE names $secrets, which is not a file uid $(id -u) can read: mount the secret there, readable by that uid"
		fi
		from=$secrets
		read_secrets <"$secrets"
	fi
	line=
	if [ "$have" = 0 ]; then
		sb_die 64 "no SANDBOXD_PASSWORD on $from: in sandbox mode this image reads its secrets from stdin or SANDBOXD_SECRETS_FILE (see deploy/images/README.md)"
	fi
	case "$pw" in
	*[!A-Za-z0-9]*) pw= ;;
	esac
	if [ "${#pw}" -lt 16 ] || [ "${#pw}" -gt 128 ]; then
		pw=
		sb_die 64 "SANDBOXD_PASSWORD on $from must be 16 to 128 characters from A-Z a-z 0-9"
	fi
	case "${SANDBOXD_PERSISTENT:-}" in
	'' | 1) ;;
	*) sb_die 64 "SANDBOXD_PERSISTENT must be 1 (data on a named volume, kept) or unset" ;;
	esac

	if [ ! -d "$rundir" ] || [ ! -w "$rundir" ]; then
		sb_die 64 "$rundir must be a writable directory: mount a tmpfs owned by uid $(id -u) there"
	fi
	if [ ! -d /data ] || [ ! -w /data ]; then
		if [ "${SANDBOXD_PERSISTENT:-}" = 1 ]; then
			sb_die 64 "/data must be a writable directory: mount a named volume there (the image's /data is owned by uid 999)"
		fi
		sb_die 64 "/data must be a writable directory: mount a tmpfs owned by uid $(id -u) there"
	fi
	# SANDBOXD_TEMPLATE=use: start from dump.rdb in the volume mounted
	# read-only on $template (a fork's copy of another server's data, or a
	# seed's RDB file), which the server loads at start (with the modules
	# the container loads).
	template=/var/lib/sandboxd/template
	case "${SANDBOXD_TEMPLATE:-}" in
	'') ;;
	use)
		if [ "${SANDBOXD_PERSISTENT:-}" = 1 ]; then
			sb_die 64 "SANDBOXD_TEMPLATE cannot be combined with SANDBOXD_PERSISTENT=1: a fork's copy seeds a throwaway data dir"
		fi
		if [ ! -r "$template/dump.rdb" ]; then
			sb_die 64 "SANDBOXD_TEMPLATE=use, but no dump.rdb is mounted on $template: mount the volume sandboxd filled (a fork's copy, a seed's file)"
		fi
		cp "$template/dump.rdb" /data/dump.rdb
		;;
	*) sb_die 64 "SANDBOXD_TEMPLATE must be use (start from dump.rdb on $template) or unset" ;;
	esac
	chmod 0700 "$rundir"
	umask 0077
	rm -f "$conf" "$rundir/admin"
	# sandboxd's own admin login (checkpoints and resets, run with `docker
	# exec` inside the container): a random password that only this tmpfs
	# file and the configuration hold, never the agent's.
	admin=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
	case "$admin" in
	????????????????????????????????????????????????) ;;
	*) sb_die 1 "could not read 24 random bytes from /dev/urandom for sandboxd's admin login" ;;
	esac
	printf '%s' "$admin" >"$rundir/admin"
	if [ "${SANDBOXD_PERSISTENT:-}" = 1 ]; then
		# Only the append-only file (appendonlydir/ in /data), fsynced every
		# second; no RDB snapshots besides the AOF's own base file.
		persistence='appendonly yes
appendfsync everysec'
	else
		persistence='appendonly no'
	fi
	# The agent's ACL starts from everything but @dangerous (the category
	# Redis and Valkey give to administration, replication, persistence,
	# debug and self-test hooks: CONFIG SET, REPLICAOF, REPLCONF, PSYNC,
	# SAVE, DEBUG, PFDEBUG, PFSELFTEST, ACL SETUSER, MODULE LOAD, MONITOR,
	# SHUTDOWN, RESTORE, MIGRATE, ...), so a command a later server puts
	# there is refused without a change here. Granted back, by name: the
	# dangerous commands that only read or empty this server's own data or
	# state, which test suites use (FLUSHALL, FLUSHDB, SWAPDB, KEYS, SORT,
	# INFO, CONFIG GET, CLIENT LIST/KILL/PAUSE/UNPAUSE/UNBLOCK/NO-EVICT,
	# LASTSAVE, ROLE, SLOWLOG, LATENCY, MODULE LIST; Valkey's COMMANDLOG).
	# Taken away too, outside @dangerous: SCRIPT DEBUG (the Lua debugger)
	# and FUNCTION RESTORE (a raw payload parser, as RESTORE is).
	# +@all covers the commands of the modules loaded at start (JSON.*, FT.*,
	# BF.*, ...; they have no ACL category, so -@dangerous leaves them): the
	# server applies this file's user line after loading them.
	# Every command named in the rule exists in Redis 8.0 and Valkey 8.1
	# (COMMANDLOG in Valkey only: a rule naming an unknown command stops
	# the server).
	grant='+flushall +flushdb +swapdb +keys +sort +sort_ro +info +config|get +client|list +client|kill +client|pause +client|unpause +client|unblock +client|no-evict +lastsave +role +slowlog|get +slowlog|len +slowlog|reset +latency|doctor +latency|graph +latency|histogram +latency|history +latency|latest +latency|reset +module|list'
	case "${server##*/}" in
	valkey-server) grant="$grant +commandlog|get +commandlog|len +commandlog|reset" ;;
	esac
	# Each loaded module's administration, debug and raw-load commands are
	# taken away again: they reach module code (parsers of raw chunks,
	# global tuning, debug hooks) that an agent's data never needs. Only
	# for the modules this container loads: a rule naming a command that no
	# loaded module registered stops the server. The table is by module
	# file (the names sandboxd's --loadmodule arguments use); the same
	# module binaries go into both images, so one table serves both.
	module_deny=
	prev=
	for a in "$@"; do
		if [ "$prev" = --loadmodule ]; then
			case "${a##*/}" in
			rejson.so) module_deny="$module_deny -json.debug" ;;
			redisearch.so)
				# FT.CONFIG has no ACL subcommands (-ft.config|set is refused):
				# all of it. The FT._*IF[N]X are the replication forms of
				# FT.CREATE/ALTER/DROPINDEX/ALIAS*, not for clients.
				module_deny="$module_deny -ft.config -ft.debug -ft._createifnx -ft._alterifnx -ft._dropifx -ft._dropindexifx -ft._aliasaddifnx -ft._aliasdelifx"
				;;
			redisbloom.so) module_deny="$module_deny -bf.loadchunk -bf.scandump -bf.debug -cf.loadchunk -cf.scandump -cf.debug" ;;
			esac
		fi
		prev=$a
	done
	{
		printf '%s\n' \
			'# sandboxd sandbox mode (written by docker-entrypoint.sh)' \
			'port 6379' \
			'bind * -::*' \
			'protected-mode no' \
			'dir /data' \
			'save ""' \
			"$persistence" \
			'enable-module-command no' \
			'enable-debug-command local' \
			'enable-protected-configs no'
		# DEBUG (for DEBUG RELOAD) only from inside the container, and only
		# for sandboxd's admin user: DEBUG is @dangerous, not the agent's.
		printf 'user sandboxd-admin on >%s ~* &* +@all\n' "$admin"
		printf 'user default on >%s ~* &* +@all -@dangerous %s -script|debug -function|restore%s\n' "$pw" "$grant" "$module_deny"
	} >"$conf"
	pw= admin=
	chmod 0600 "$conf" "$rundir/admin"
	cd /data
	exec "$server" "$conf" "$@" </dev/null
fi

if [ "${1:-}" = "$server" ]; then
	# Upstream builds the server with protected mode off by default, because
	# it runs without a config file; Debian's binary defaults to on. Turn it
	# off unless the arguments or the given config file say otherwise.
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
	set -- "$server" "$@"

	# allow the container to be started with `--user`
	if [ "$(id -u)" = 0 ]; then
		if [ "$(stat -c %u .)" != "$(id -u "$user")" ]; then
			chown "$user:$user" . || echo "warning: cannot chown $(pwd) to $user (no CAP_CHOWN?): saving will fail unless it is writable by uid $(id -u "$user")" >&2
		fi
		find . -mindepth 1 \! -user "$user" -exec chown "$user" '{}' + 2>/dev/null || :
		export HOME=/data USER=$user LOGNAME=$user
		exec setpriv --reuid="$user" --regid="$user" --init-groups -- "$0" "$@"
	fi

	# set an appropriate umask (if one isn't set already)
	if [ "$(umask)" = 0022 ]; then
		umask 0077
	fi
fi

exec "$@"
