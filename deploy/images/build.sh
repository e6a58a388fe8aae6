#!/usr/bin/env bash
# Build sandboxd's engine images from Debian trixie packages.
#
# No container registry is needed: the base image is made with debootstrap and
# `docker import`, every other image is a Dockerfile FROM that base whose
# packages come from the Debian mirror (and redis-modules' Redis modules from
# a PyPI wheel whose sha256 its Dockerfile pins).
#
#   deploy/images/build.sh [--force] [IMAGE...]
#
# Every directory next to this script that holds a Dockerfile is an image
# named after the directory: its tag is the `# image: REPO:TAG` line among the
# Dockerfile's leading comments, its parent the image that its FROM names
# (`base` is the debootstrap image, sandboxd/debian-base:trixie). Adding an
# image takes only a new directory.
#
# IMAGE is `base` or a directory name (default: all). An image that already
# exists and is up to date is skipped unless --force is given (which also
# bypasses the layer cache, to pick up Debian updates); missing or outdated
# parents of a requested image are built too. Parents build before their
# children, independent images in parallel, at most 2 builds at once.
# Progress goes to stderr; the full output of each step goes to a log that is
# shown only on failure.
#
# Up to date means: every image carries the label io.sandboxd.image.source, a
# sha256 over its sources (for a directory: each file's path, executable bit
# and content, plus the source hashes of its parents; for the base: the suite
# and the text of build_base), and a Dockerfile image also the label
# io.sandboxd.image.parents with the image ids of its parents it was built on.
# An image whose source label differs from the sources now ("source changed"),
# or whose parent has another id or is rebuilt in this run ("parent
# changed"), is rebuilt like a missing one (with the layer cache, unless
# --force), so editing an entrypoint is enough to get it rebuilt.
#
# Build context: a copy of the directory plus the file
# .host-ca-certificates.crt, the host's CA bundle (HOST_CA_BUNDLE), so that a
# build step that downloads over HTTPS (redis-modules: PyPI) trusts what the
# host trusts, e.g. a TLS-inspecting egress proxy's CA. Such a step pins the
# sha256 of what it downloads, so the bundle decides only whether the
# download may proceed, never what is installed. The file is not a source
# (it does not count for "up to date"); building a directory with a plain
# `docker build` needs it (an empty file will do).
#
# Environment:
#   DEBIAN_MIRROR   mirror for debootstrap and apt (default http://deb.debian.org/debian)
#   DEBIAN_SECURITY security mirror (default http://deb.debian.org/debian-security)
#   HOST_CA_BUNDLE  CA bundle given to builds (default /etc/ssl/certs/ca-certificates.crt;
#                   an empty file when it is not readable)
#   KEEP_LOGS=1     keep the work directory with the logs
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SUITE=trixie
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY="${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
HOST_CA_BUNDLE="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

BASE_IMAGE="sandboxd/debian-base:${SUITE}"
MAX_JOBS=2 # docker builds at once (2 cores here)

# The legacy builder: it never tries to pull anything for a local FROM.
export DOCKER_BUILDKIT=0

T0=$SECONDS
log() { printf '[images %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------
# Discovery: deploy/images/NAME/Dockerfile -> IMAGE[NAME], PARENTS[NAME].
# ---------------------------------------------------------------------------
declare -A IMAGE=([base]="$BASE_IMAGE") # name -> REPO:TAG
declare -A NAME_OF=(["$BASE_IMAGE"]=base) # REPO:TAG -> name
declare -A PARENTS=()                    # name -> its FROM images built here (names)
declare -A EXTERNAL=()                   # name -> its FROM images not built here
ALL=(base)                               # base, then the directory names, sorted
TOPO=()                                  # every parent before its children
PROBLEMS=()

# header_tag DOCKERFILE: REPO:TAG of the `# image:` line in the leading comments.
header_tag() {
	awk '{ sub(/\r$/, "") }
		!/^[[:space:]]*(#|$)/ { exit }
		/^# image: [^[:space:]]+[[:space:]]*$/ { print $3; exit }' "$1"
}
# from_images DOCKERFILE: the image each FROM names (not stages, not scratch).
from_images() {
	awk '{ sub(/\r$/, "") }
		toupper($1) == "FROM" {
			i = 2
			while ($i ~ /^--/) i++
			if ($i != "" && $i != "scratch" && !(tolower($i) in stage)) print $i
			if (toupper($(i + 1)) == "AS") stage[tolower($(i + 2))] = 1
		}' "$1"
}

discover() {
	local df name tag img names=()
	for df in "$HERE"/*/Dockerfile; do
		[[ -f $df ]] || continue
		name=${df%/Dockerfile}
		names+=("${name##*/}")
	done
	# By name (the glob would put postgres-ext/ before postgres/).
	while read -r name; do
		[[ -n $name ]] || continue
		df="$HERE/$name/Dockerfile"
		tag=$(header_tag "$df")
		if [[ $name == base ]]; then
			PROBLEMS+=("$name/: 'base' is the debootstrap image, pick another directory name")
		elif [[ -z $tag ]]; then
			PROBLEMS+=("$name/Dockerfile: no '# image: REPO:TAG' line in its leading comments")
		elif [[ ${tag##*/} != *:* ]]; then
			PROBLEMS+=("$name/Dockerfile: '# image: $tag' has no :TAG")
		elif [[ -n ${NAME_OF[$tag]:-} ]]; then
			PROBLEMS+=("$name/Dockerfile: $tag is already ${NAME_OF[$tag]}'s tag")
		else
			IMAGE[$name]=$tag
			NAME_OF[$tag]=$name
			ALL+=("$name")
		fi
	done < <(printf '%s\n' "${names[@]}" | LC_ALL=C sort)
	for name in "${ALL[@]:1}"; do
		PARENTS[$name]='' EXTERNAL[$name]=''
		while read -r img; do
			if [[ -n ${NAME_OF[$img]:-} ]]; then
				PARENTS[$name]+=" ${NAME_OF[$img]}"
			else
				EXTERNAL[$name]+=" $img"
			fi
		done < <(from_images "$HERE/$name/Dockerfile")
		[[ -n ${PARENTS[$name]}${EXTERNAL[$name]} ]] || PROBLEMS+=("$name/Dockerfile: no FROM line")
	done
	local -A mark=()
	visit() {
		local n=$1 p
		case "${mark[$n]:-}" in
		seen) return 0 ;;
		active) PROBLEMS+=("the FROM lines go round in a circle through $n"); return 0 ;;
		esac
		mark[$n]=active
		for p in ${PARENTS[$n]:-}; do visit "$p"; done
		mark[$n]=seen
		TOPO+=("$n")
	}
	for name in "${ALL[@]}"; do visit "$name"; done
}
discover

usage() {
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
	local n from p
	{
		printf '\nImages here:\n'
		for n in "${ALL[@]}"; do
			from=debootstrap
			if [[ $n != base ]]; then
				from=FROM
				for p in ${PARENTS[$n]} ${EXTERNAL[$n]}; do from+=" $p"; done
			fi
			printf '  %-14s %-32s %s\n' "$n" "${IMAGE[$n]}" "$from"
		done
		for p in "${PROBLEMS[@]}"; do printf '  problem: %s\n' "$p"; done
	} >&2
	exit "${1:-0}"
}

FORCE=0
WANT=()
for arg in "$@"; do
	case "$arg" in
	--force | -f) FORCE=1 ;;
	--help | -h) usage 0 ;;
	-*) log "unknown option: $arg"; usage 2 ;;
	*) WANT+=("$arg") ;;
	esac
done
if ((${#PROBLEMS[@]})); then
	for p in "${PROBLEMS[@]}"; do log "$p"; done
	die "fix the image directories above first"
fi
for n in "${WANT[@]}"; do
	[[ -n "${IMAGE[$n]:-}" ]] || die "unknown image '$n' (one of: ${ALL[*]})"
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
	# Keep the logs on failure (if there are any) or when asked to.
	local keep=0
	if [[ "${KEEP_LOGS:-0}" == 1 ]]; then keep=1; fi
	if ((rc != 0)) && compgen -G "$WORK/*.log" >/dev/null; then keep=1; fi
	if ((keep)) && [[ -d "$WORK" ]]; then
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

# ---------------------------------------------------------------------------
# Source hashes and labels: when an existing image is outdated.
# ---------------------------------------------------------------------------
SOURCE_LABEL=io.sandboxd.image.source
PARENTS_LABEL=io.sandboxd.image.parents
declare -A SOURCE=() # name -> sha256 of its sources (and its parents')

# source_hash NAME (parents first): see the header.
source_hash() {
	local n=$1 f p
	{
		if [[ $n == base ]]; then
			printf 'suite %s\n' "$SUITE"
			declare -f build_base
		else
			while IFS= read -r -d '' f; do
				printf 'file %q %s %s\n' "$f" "$([[ -x $HERE/$n/$f ]] && echo x || echo -)" \
					"$(sha256sum <"$HERE/$n/$f" | cut -d' ' -f1)"
			done < <(cd "$HERE/$n" && find . \( -type f -o -type l \) -print0 | LC_ALL=C sort -z)
			for p in ${PARENTS[$n]:-}; do printf 'parent %s %s\n' "$p" "${SOURCE[$p]}"; done
		fi
	} | sha256sum | cut -d' ' -f1
}

# parent_ids NAME: "parent=image-id ..." of NAME's parents as they are now.
parent_ids() {
	local p out=''
	for p in ${PARENTS[$1]:-}; do
		out+="${out:+ }$p=$(docker image inspect -f '{{.Id}}' "${IMAGE[$p]}" 2>/dev/null || :)"
	done
	printf '%s' "$out"
}

# stale_reason NAME: why NAME must be built; nothing when it is up to date.
stale_reason() {
	local n=$1 p labels src pids
	if ! labels=$(docker image inspect -f "{{index .Config.Labels \"$SOURCE_LABEL\"}}|{{index .Config.Labels \"$PARENTS_LABEL\"}}" \
		"${IMAGE[$n]}" 2>/dev/null); then
		echo "missing, building"
		return 0
	fi
	src=${labels%%|*} pids=${labels#*|}
	if [[ $src != "${SOURCE[$n]}" ]]; then
		echo "source changed, rebuilding"
		return 0
	fi
	for p in ${PARENTS[$n]:-}; do
		if [[ -n ${TODO[$p]:-} ]]; then
			echo "parent $p is rebuilt, rebuilding"
			return 0
		fi
	done
	if [[ -n ${PARENTS[$n]:-} && $pids != "$(parent_ids "$n")" ]]; then
		echo "parent changed, rebuilding"
	fi
}

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
# sandboxd/debian-base:trixie
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
	# deb822 sources, as in Debian's own trixie images.
	rm -f "$root/etc/apt/sources.list"
	cat >"$root/etc/apt/sources.list.d/debian.sources" <<-EOF
		Types: deb
		URIs: $DEBIAN_MIRROR
		Suites: $SUITE $SUITE-updates
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.pgp

		Types: deb
		URIs: $DEBIAN_SECURITY
		Suites: $SUITE-security
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.pgp
	EOF
	[[ -s $root/usr/share/keyrings/debian-archive-keyring.pgp ]] ||
		{ log "base: no debian-archive-keyring.pgp in the $SUITE root"; return 1; }
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
			--change "LABEL org.opencontainers.image.source=sandboxd org.opencontainers.image.title=debian-base org.opencontainers.image.base.name=debian:$SUITE" \
			--change "LABEL $SOURCE_LABEL=${SOURCE[base]}" \
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
	# The context: the directory, plus the host's CA bundle as
	# .host-ca-certificates.crt (see the header; not a source, so not hashed).
	local ctx="$WORK/context-$name"
	mkdir -p "$ctx"
	cp -a "$HERE/$name/." "$ctx/"
	if [[ -r $HOST_CA_BUNDLE ]]; then
		cp "$HOST_CA_BUNDLE" "$ctx/.host-ca-certificates.crt"
	else
		: >"$ctx/.host-ca-certificates.crt"
	fi
	# The labels that tell later runs whether this image is up to date (they
	# come last in the build, after every cached step).
	run "$name" docker build --network host --force-rm "${nocache[@]}" \
		--label "$SOURCE_LABEL=${SOURCE[$name]}" \
		--label "$PARENTS_LABEL=$(parent_ids "$name")" \
		-t "${IMAGE[$name]}" "$ctx"
	rm -rf "$ctx"
	log "$name: ${IMAGE[$name]} built in $((SECONDS - t))s"
}

build_one() {
	if [[ $1 == base ]]; then build_base; else build_dockerfile "$1"; fi
}

# ---------------------------------------------------------------------------
# Plan: which images to build, with their missing or outdated parents.
# ---------------------------------------------------------------------------
for n in "${TOPO[@]}"; do SOURCE[$n]=$(source_hash "$n"); done
declare -A TODO=() PLANNED=() WANTED=()
for n in "${WANT[@]}"; do WANTED[$n]=1; done
plan() { # NAME FORCED
	local n=$1 forced=$2 p why
	[[ -z "${PLANNED[$n]:-}" ]] || return 0
	PLANNED[$n]=1
	for p in ${PARENTS[$n]:-}; do plan "$p" 0; done
	why=$(stale_reason "$n")
	if ((forced)) && [[ -z $why ]]; then why="--force, rebuilding"; fi
	if [[ -n $why ]]; then
		TODO[$n]=1
		log "$n: ${IMAGE[$n]} $why"
	fi
}
# Parents first (TOPO), so that a requested parent is planned with --force.
for n in "${TOPO[@]}"; do
	if [[ -n "${WANTED[$n]:-}" ]]; then plan "$n" "$FORCE"; fi
done
# Anything else a FROM names must already be here: there is no registry.
for n in "${!TODO[@]}"; do
	for p in ${EXTERNAL[$n]:-}; do
		exists "$p" || die "$n: FROM $p is not built here and not present locally"
	done
done

for n in "${WANT[@]}"; do
	if [[ -z "${TODO[$n]:-}" ]]; then
		log "$n: ${IMAGE[$n]} up to date, skipped (use --force to rebuild)"
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

# Build in the background, at most MAX_JOBS at once, each as soon as its
# parents are there; a finished job reports "NAME STATUS" on a FIFO.
mkfifo "$WORK/done"
exec 3<>"$WORK/done"
job() {
	set +e
	# No `|| ...` here: it would switch off errexit inside build_one.
	(set -e; build_one "$1") 3>&-
	echo "$1 $?" >&3
}
declare -A STATE=() # name -> running, ok or failed
# parents_state NAME: ready, wait or failed.
parents_state() {
	local p s=ready
	for p in ${PARENTS[$1]:-}; do
		[[ -n "${TODO[$p]:-}" ]] || continue # already there
		case "${STATE[$p]:-}" in
		ok) ;;
		failed) echo failed; return 0 ;;
		*) s="wait" ;;
		esac
	done
	echo "$s"
}
left=${#TODO[@]} running=0 failed=()
while ((left > 0)); do
	for n in "${TOPO[@]}"; do
		[[ -n "${TODO[$n]:-}" && -z "${STATE[$n]:-}" ]] || continue
		case "$(parents_state "$n")" in
		failed)
			log "$n: not built, a parent failed"
			STATE[$n]=failed
			left=$((left - 1))
			failed+=("$n")
			;;
		ready)
			if ((running < MAX_JOBS)); then
				STATE[$n]=running
				running=$((running + 1))
				job "$n" &
				BG_PIDS+=($!)
			fi
			;;
		esac
	done
	((left > 0)) || break
	((running > 0)) || die "nothing left to run but ${left} image(s) to build (bug)"
	read -r done_name done_rc <&3
	running=$((running - 1)) left=$((left - 1))
	if [[ $done_rc == 0 ]]; then
		STATE[$done_name]=ok
	else
		STATE[$done_name]=failed
		failed+=("$done_name")
	fi
done
wait
BG_PIDS=()
exec 3>&-
((${#failed[@]} == 0)) || die "some images failed to build: ${failed[*]}"

# dangling_on IMAGE-ID: untagged leaf images built on IMAGE-ID, i.e. build
# cache: the layers of an earlier build stage (redis-modules' fetch stage) or
# of a failed build. They keep a replaced image alive ("has dependent child
# images") although nothing can use them any more.
dangling_on() {
	local leaf id
	for leaf in $(docker images -a -q --no-trunc --filter dangling=true); do
		id=$leaf
		while [[ -n $id ]]; do
			if [[ $id == "$1" ]]; then
				printf '%s\n' "$leaf"
				break
			fi
			id=$(docker image inspect -f '{{.Parent}}' "$id" 2>/dev/null) || break
		done
	done
}

# Drop replaced images (children first); one still used by a container stays.
# Removing an old child also prunes its untagged parents, which can include
# the replaced parent already; build cache left on a replaced image goes too.
for ((i = ${#TOPO[@]} - 1; i >= 0; i--)); do
	n=${TOPO[i]}
	old="${OLD_ID[$n]:-}"
	if [[ -n "$old" && "$old" != "$(docker image inspect -f '{{.Id}}' "${IMAGE[$n]}")" ]] && exists "$old"; then
		if ! err=$(docker rmi "$old" 2>&1 >/dev/null); then
			if [[ $err == *"dependent child images"* ]]; then
				for leaf in $(dangling_on "$old"); do docker rmi "$leaf" >/dev/null 2>&1 || :; done
				if ! exists "$old" || err=$(docker rmi "$old" 2>&1 >/dev/null); then continue; fi
			fi
			log "$n: old image ${old#sha256:} kept (${err##*: })"
		fi
	fi
done

for n in "${ALL[@]}"; do
	[[ -n "${TODO[$n]:-}" ]] || continue
	log "$(docker image inspect -f '{{index .RepoTags 0}}  {{.Size}} bytes' "${IMAGE[$n]}" |
		awk '{printf "%-34s %4d MB", $1, $2 / 1000000}')"
done
log "done in $((SECONDS - T0))s"
