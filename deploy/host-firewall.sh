#!/usr/bin/env bash
# The host guard of sandbox networks. Run once per boot, as root, on the
# Docker host (scripts/run.sh and scripts/test.sh do it for you):
#
#   deploy/host-firewall.sh            install (idempotent)
#   deploy/host-firewall.sh --check    exit 0 if installed, 1 if not
#   deploy/host-firewall.sh --remove   remove
#   deploy/host-firewall.sh --keep     install, then put back any rule that
#                                      goes missing (every 30 s) until SIGTERM:
#                                      the compose stack's `host-guard` service
#
# Why, between networks: Docker 20.10 keeps bridge networks apart with a
# jump from FORWARD to DOCKER-ISOLATION-STAGE-1, and on every network
# creation it deletes that jump and inserts it again. In between, packets are
# routed from any network to any other: measured here, a container on the
# default bridge connected to a sandbox's engine 3 times in 300 tries while
# networks were being created. sandboxd creates one network per sandbox, so
# the gap is frequent.
#
# Why, to the host: a sandbox network's gateway address is the host's own
# address on that bridge, and Docker filters only what it forwards. A
# service the host binds on that address (or on every address: 0.0.0.0,
# [::]) answered a sandbox container, internal network or not: measured on
# Engine 20.10 with a listener on the gateway of a bridge without
# masquerading. The host's other addresses are reached the same way.
#
# The guard: sandboxd names the Linux bridge of every sandbox network without
# egress `sbx…` (see `bridge_name` in src/domain/network.rs), and rules in
# the mangle table, which Docker never rewrites, drop
#   - every packet routed into or out of such a bridge (FORWARD). Traffic
#     inside one sandbox network is bridged (physdev "is-bridged") and passes;
#   - every packet a sandbox container sends to the host itself (INPUT) that
#     is not part of a connection the host opened. The host's own connections
#     to sandboxes (published 127.0.0.1 ports, sandboxd's probes) are opened
#     from the host: their answers are ESTABLISHED and pass. The same INPUT
#     rule is installed for IPv6 (the bridge has a link-local address).
set -euo pipefail
set -f # the rules below are split into words, never globbed

# Each rule: the command, the chain of the mangle table, the rule.
RULES=(
	"iptables FORWARD -i sbx+ -m physdev ! --physdev-is-bridged -j DROP"
	"iptables FORWARD -o sbx+ -m physdev ! --physdev-is-bridged -j DROP"
	"iptables INPUT -i sbx+ -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"
	"ip6tables INPUT -i sbx+ -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"
)

# shellcheck disable=SC2086 # the rules are split on purpose
have() { # "COMMAND CHAIN RULE…": whether the rule is installed
	set -- $1
	local cmd=$1 chain=$2
	shift 2
	"$cmd" -w -t mangle -C "$chain" "$@" 2>/dev/null
}

case "${1:-}" in
--check)
	for r in "${RULES[@]}"; do have "$r" || exit 1; done
	;;
--remove)
	for r in "${RULES[@]}"; do
		# shellcheck disable=SC2086
		set -- $r
		while have "$r"; do "$1" -w -t mangle -D "$2" "${@:3}"; done
	done
	;;
'' | --keep)
	for cmd in iptables ip6tables; do
		command -v "$cmd" >/dev/null || {
			echo "host-firewall: $cmd not found; install it (Debian: apt-get install iptables)" >&2
			exit 1
		}
	done
	install() {
		local r put=0
		for r in "${RULES[@]}"; do
			# shellcheck disable=SC2086
			set -- $r
			have "$r" || { "$1" -w -t mangle -I "$2" "${@:3}" && put=$((put + 1)); }
		done
		echo "$put"
	}
	put=$(install)
	[[ ${1:-} == --keep ]] || exit 0
	echo "host-firewall: guard installed ($put rules added); keeping it"
	# As a container's PID 1, a signal without a handler is ignored.
	trap 'exit 0' TERM INT
	while :; do
		sleep 30 &
		wait $! || :
		put=$(install)
		((put == 0)) || echo "host-firewall: $put rules were missing (flushed?), put back"
	done
	;;
*)
	sed -n '2,12{s/^# \{0,1\}//;p}' "$0" >&2
	exit 2
	;;
esac
