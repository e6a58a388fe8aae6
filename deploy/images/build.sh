#!/usr/bin/env bash
# Build sandboxd's engine images from Debian bookworm packages.
#
# No container registry is needed: the base image is made with debootstrap and
# `docker import`, every other image is a Dockerfile FROM that base whose
# packages come from the Debian mirror.
#
#   deploy/images/build.sh [--force] [IMAGE...]
#
# IMAGE is any of: base postgres postgres-ext redis redis-ext (default: all).
# An image that already exists is skipped unless --force is given (which
# also bypasses the layer cache, to pick up Debian updates); missing parents
# of a requested image are built too. Progress goes to stderr; the
# full output of each step goes to a log that is shown only on failure.
#
# Environment:
#   DEBIAN_MIRROR   mirror for debootstrap and apt (default http://deb.debian.org/debian)
#   DEBIAN_SECURITY security mirror (default http://deb.debian.org/debian-security)
#   KEEP_LOGS=1     keep the work directory with the logs
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY="${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"

BASE_IMAGE="sandboxd/debian-base:${SUITE}"
declare -A IMAGE=(
	[base]="$BASE_IMAGE"
	[postgres]="sandboxd/postgres:15"
	[postgres-ext]="sandboxd/postgres-ext:15"
	[redis]="sandboxd/redis:7"
	[redis-ext]="sandboxd/redis-ext:7"
)
declare -A PARENT=(
	[postgres]=base
	[postgres-ext]=postgres
	[redis]=base
	[redis-ext]=redis
)
ALL=(base postgres postgres-ext redis redis-ext)

# The legacy builder: it never tries to pull anything for a local FROM.
export DOCKER_BUILDKIT=0

T0=$SECONDS
log() { printf '[images %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
	exit "${1:-0}"
}

FORCE=0
WANT=()
for arg in "$@"; do
	case "$arg" in
	--force | -f) FORCE=1 ;;
	--help | -h) usage 0 ;;
	-*) log "unknown option: $arg"; usage 2 ;;
	*)
		[[ -n "${IMAGE[$arg]:-}" ]] || die "unknown image '$arg' (one of: ${ALL[*]})"
		WANT+=("$arg")
		;;
	esac
done
((${#WANT[@]})) || WANT=("${ALL[@]}")

[[ $EUID -eq 0 ]] || die "must run as root (debootstrap needs it)"
command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon"

WORK="$(mktemp -d /tmp/sandboxd-images.XXXXXX)"
BG_PIDS=()
cleanup() {
	local rc=$?
	local p
	for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [[ -d "$WORK/rootfs" ]]; then
		# debootstrap may have left mounts behind when interrupted.
		local m
		awk -v r="$WORK/rootfs/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r |
			while read -r m; do umount -l "$m" 2>/dev/null || true; done
	fi
	if [[ "${KEEP_LOGS:-0}" == 1 || $rc -ne 0 ]] && [[ -d "$WORK" ]]; then
		find "$WORK" -mindepth 1 -maxdepth 1 ! -name '*.log' -exec rm -rf {} +
		log "logs kept in $WORK"
	else
		rm -rf "$WORK"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

exists() { docker image inspect "$1" >/dev/null 2>&1; }

# run LOGNAME CMD...: run quietly, show the tail of the log on failure.
run() {
	local name=$1
	shift
	if ! "$@" >"$WORK/$name.log" 2>&1; then
		log "FAILED: $* (last lines of $name.log follow)"
		tail -n 40 "$WORK/$name.log" | sed 's/\x1b\[[0-9;]*m//g; s/^/    /' >&2
		return 1
	fi
}

# ---------------------------------------------------------------------------
# sandboxd/debian-base:bookworm
# ---------------------------------------------------------------------------
build_base() {
	local t=$SECONDS root="$WORK/rootfs"
	if ! command -v debootstrap >/dev/null; then
		log "installing debootstrap"
		# A broken third-party source must not stop us; the install below
		# fails clearly if debootstrap really cannot be had.
		run apt-update apt-get update -q || log "apt-get update reported errors, trying anyway"
		run apt-debootstrap env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends debootstrap
	fi
	log "base: debootstrap --variant=minbase $SUITE"
	run debootstrap debootstrap --variant=minbase --force-check-gpg \
		"$SUITE" "$root" "$DEBIAN_MIRROR"

	log "base: trimming and configuring"
	cat >"$root/etc/apt/sources.list" <<-EOF
		deb $DEBIAN_MIRROR $SUITE main
		deb $DEBIAN_MIRROR $SUITE-updates main
		deb $DEBIAN_SECURITY $SUITE-security main
	EOF
	# Never start services from maintainer scripts inside an image.
	printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
	chmod 755 "$root/usr/sbin/policy-rc.d"
	# Like the official "slim" images: keep apt lean and skip docs/locales.
	cat >"$root/etc/apt/apt.conf.d/90sandboxd" <<-'EOF'
		APT::Install-Recommends "false";
		APT::Install-Suggests "false";
		APT::AutoRemove::SuggestsImportant "false";
		Acquire::Languages "none";
		Dir::Cache::pkgcache "";
		Dir::Cache::srcpkgcache "";
		DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
		APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
	EOF
	cat >"$root/etc/dpkg/dpkg.cfg.d/90sandboxd-slim" <<-'EOF'
		path-exclude /usr/share/doc/*
		path-include /usr/share/doc/*/copyright
		path-exclude /usr/share/man/*
		path-exclude /usr/share/info/*
		path-exclude /usr/share/groff/*
		path-exclude /usr/share/lintian/*
		path-exclude /usr/share/locale/*
		path-include /usr/share/locale/locale.alias
	EOF
	find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
	find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
	find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
	rm -rf "$root"/usr/share/{man,info,groff,lintian}/*
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
		"$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old \
		"$root"/var/lib/dpkg/*-old "$root"/tmp/* "$root"/var/tmp/*
	mkdir -p "$root/var/lib/apt/lists/partial"
	find "$root/var/log" -type f -exec truncate -s 0 {} +
	rm -f "$root/var/log/bootstrap.log"
	# Docker provides these at run time; do not bake in the build host's.
	: >"$root/etc/resolv.conf"
	echo localhost >"$root/etc/hostname"

	log "base: docker import"
	tar --numeric-owner --xattrs -C "$root" -c . |
		run import docker import \
			--change 'CMD ["bash"]' \
			--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'LABEL org.opencontainers.image.source=sandboxd org.opencontainers.image.title=debian-base org.opencontainers.image.base.name=debian:bookworm' \
			--message "sandboxd debootstrap --variant=minbase $SUITE" \
			- "${IMAGE[base]}"
	rm -rf "$root"
	log "base: ${IMAGE[base]} built in $((SECONDS - t))s"
}

# ---------------------------------------------------------------------------
# Dockerfile images
# ---------------------------------------------------------------------------
build_dockerfile() {
	local name=$1 t=$SECONDS
	log "$name: docker build ${IMAGE[$name]}"
	# Host networking for RUN steps: no dependence on the bridge, NAT or the
	# daemon's DNS fallback; traffic only goes to the Debian mirror.
	local nocache=()
	if ((FORCE)); then nocache=(--no-cache); fi
	run "$name" docker build --network host --force-rm "${nocache[@]}" \
		-t "${IMAGE[$name]}" "$HERE/$name"
	log "$name: ${IMAGE[$name]} built in $((SECONDS - t))s"
}

build_one() {
	if [[ $1 == base ]]; then build_base; else build_dockerfile "$1"; fi
}

# ---------------------------------------------------------------------------
# Plan: which images to build, with their missing parents.
# ---------------------------------------------------------------------------
declare -A TODO=()
plan() {
	local n=$1
	[[ -n "${TODO[$n]:-}" ]] && return 0
	if ((FORCE)) || ! exists "${IMAGE[$n]}"; then
		TODO[$n]=1
	fi
	if [[ -n "${PARENT[$n]:-}" ]] && ! exists "${IMAGE[${PARENT[$n]}]}"; then
		plan "${PARENT[$n]}"
	fi
}
for n in "${WANT[@]}"; do plan "$n"; done

for n in "${WANT[@]}"; do
	if [[ -z "${TODO[$n]:-}" ]]; then
		log "$n: ${IMAGE[$n]} exists, skipped (use --force to rebuild)"
	fi
done
if ((${#TODO[@]} == 0)); then
	log "nothing to build"
	exit 0
fi

# Remember what the tags point at now, to drop the replaced images at the end.
declare -A OLD_ID=()
for n in "${!TODO[@]}"; do
	OLD_ID[$n]="$(docker image inspect -f '{{.Id}}' "${IMAGE[$n]}" 2>/dev/null || true)"
done

# The base first; then the postgres and redis chains run in parallel.
if [[ -n "${TODO[base]:-}" ]]; then build_base; fi

chain() {
	local n
	for n in "$@"; do
		# No `|| ...` here: it would switch off errexit inside build_one.
		if [[ -n "${TODO[$n]:-}" ]]; then build_one "$n"; fi
	done
}
chain postgres postgres-ext &
BG_PIDS+=($!)
chain redis redis-ext &
BG_PIDS+=($!)

rc=0
for p in "${BG_PIDS[@]}"; do wait "$p" || rc=1; done
BG_PIDS=()
((rc == 0)) || die "some images failed to build"

# Drop replaced images (children first); one still used by a container stays.
for n in redis-ext redis postgres-ext postgres base; do
	old="${OLD_ID[$n]:-}"
	if [[ -n "$old" && "$old" != "$(docker image inspect -f '{{.Id}}' "${IMAGE[$n]}")" ]]; then
		docker rmi "$old" >/dev/null 2>&1 || log "$n: old image ${old#sha256:} kept (still in use)"
	fi
done

for n in "${ALL[@]}"; do
	[[ -n "${TODO[$n]:-}" ]] || continue
	log "$(docker image inspect -f '{{index .RepoTags 0}}  {{.Size}} bytes' "${IMAGE[$n]}" |
		awk '{printf "%-28s %4d MB", $1, $2 / 1000000}')"
done
log "done in $((SECONDS - T0))s"
