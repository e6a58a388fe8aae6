#!/usr/bin/env bash
# The host guard of sandbox networks. Run once per boot, as root, on the
# Docker host (scripts/run.sh and scripts/test.sh do it for you):
#
#   deploy/host-firewall.sh            install (idempotent)
#   deploy/host-firewall.sh --check    exit 0 if installed, 1 if not
#   deploy/host-firewall.sh --remove   remove
#
# Why: Docker 20.10 keeps bridge networks apart with a jump from FORWARD to
# DOCKER-ISOLATION-STAGE-1, and on every network creation it deletes that
# jump and inserts it again. In between, packets are routed from any network
# to any other: measured here, a container on the default bridge connected
# to a sandbox's engine 3 times in 300 tries while networks were being
# created. sandboxd creates one network per sandbox, so the gap is frequent.
#
# The guard: sandboxd names the Linux bridge of every sandbox network without
# egress `sbx…` (see `bridge_name` in src/domain/network.rs), and two rules
# in the mangle table, which Docker never rewrites, drop every packet routed
# into or out of such a bridge. Traffic inside one sandbox network is bridged
# (physdev "is-bridged") and passes; the host's own connections (published
# 127.0.0.1 ports, sandboxd's probes) are not forwarded and pass too.
set -euo pipefail

RULES=(
	"-i sbx+ -m physdev ! --physdev-is-bridged -j DROP"
	"-o sbx+ -m physdev ! --physdev-is-bridged -j DROP"
)

have() { # RULE: whether the rule is in mangle FORWARD
	# shellcheck disable=SC2086 # the rule is split on purpose
	iptables -w -t mangle -C FORWARD $1 2>/dev/null
}

case "${1:-}" in
--check)
	for r in "${RULES[@]}"; do have "$r" || exit 1; done
	;;
--remove)
	for r in "${RULES[@]}"; do
		# shellcheck disable=SC2086
		while have "$r"; do iptables -w -t mangle -D FORWARD $r; done
	done
	;;
'')
	command -v iptables >/dev/null || {
		echo "host-firewall: iptables not found; install it (Debian: apt-get install iptables)" >&2
		exit 1
	}
	for r in "${RULES[@]}"; do
		# shellcheck disable=SC2086
		have "$r" || iptables -w -t mangle -I FORWARD $r
	done
	;;
*)
	sed -n '2,9{s/^# \{0,1\}//;p}' "$0" >&2
	exit 2
	;;
esac
