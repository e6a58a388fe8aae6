#!/bin/sh
# Runs once, when the state volume is initialised (the postgres image runs
# /docker-entrypoint-initdb.d/* as its superuser): creates sandboxd's own
# role `sandboxd`, an ordinary one (no superuser, CREATEROLE or CREATEDB)
# with the password SANDBOXD_STATE_PASSWORD, and the database `sandboxd` it
# owns. sandboxd migrates that database as its owner. Orchestrator roles are
# created by the superuser and registered with `sandboxd grant-orchestrator`
# (docs/contract.md, "Roles"). Needs psql 15 or later (\getenv), as in postgres:15+
# and sandboxd/postgres:17.
set -eu
: "${SANDBOXD_STATE_PASSWORD:?set SANDBOXD_STATE_PASSWORD}"
# The password reaches SQL through psql's \getenv, never through argv.
psql -v ON_ERROR_STOP=1 --no-psqlrc -q --username "${POSTGRES_USER:-postgres}" --dbname postgres <<'EOSQL'
\getenv sandboxd_password SANDBOXD_STATE_PASSWORD
CREATE ROLE sandboxd LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'sandboxd_password';
CREATE DATABASE sandboxd OWNER sandboxd;
EOSQL
