#!/bin/sh
# Makes the compose stack's secrets that are missing, once; keeps existing
# ones. Run it before the first `docker-compose ... up` (deploy/compose.yaml):
#
#   deploy/compose/secrets.sh
#
# deploy/compose/secrets/grafana-admin-password: Grafana's `admin` password
# (32 random hex characters), which compose hands to Grafana as the secret
# grafana_admin_password (GF_SECURITY_ADMIN_PASSWORD__FILE). Only root (the
# owner of this directory, mode 0700) reads it on the host; the file itself
# is 0644, because compose bind-mounts it as it is into the Grafana
# container, whose user (uid 472) must read it. The directory is in
# .gitignore.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
umask 077
mkdir -p "$dir"
chmod 700 "$dir"
file="$dir/grafana-admin-password"
# An `up` before this script leaves an empty directory in the file's place.
if [ -d "$file" ]; then rmdir "$file"; fi
if [ ! -s "$file" ]; then
	head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$file.new"
	chmod 644 "$file.new"
	mv -f "$file.new" "$file"
	echo "secrets: made $file (Grafana's admin password)"
else
	echo "secrets: $file exists, kept"
fi
