-- An orchestrator in plain SQL (docs/contract.md, "Plain SQL"): request a sandbox with
-- Postgres (pg_trgm) and Redis, wait until it is ready, use its Postgres
-- from the Docker host, touch it, release it. One line per step on stdout;
-- any failure stops psql with a non-zero exit status.
--
--   psql -X -v ON_ERROR_STOP=1 -v state_url="$DATABASE_URL" \
--        -f examples/sql/orchestrator.sql "$DATABASE_URL"
--
-- Variables (-v name=value): state_url, the state database's URL to come
-- back to after visiting the sandbox (default: $DATABASE_URL); id, the
-- sandbox id (default: example-sql-<random>); timeout, seconds to wait for
-- ready (default 90). Run it as an orchestrator role (docs/contract.md, "Roles").

\set ON_ERROR_STOP on
\set QUIET on

\if :{?state_url}
\else
\getenv state_url DATABASE_URL
\if :{?state_url}
\else
DO $$ BEGIN RAISE EXCEPTION 'pass the state database URL: -v state_url=... (or set DATABASE_URL)'; END $$;
\endif
\endif
\if :{?id}
\else
SELECT 'example-sql-' || substr(md5(random()::text), 1, 8) AS id \gset
\endif
\if :{?timeout}
\else
\set timeout 90
\endif

-- 1. Ask, additively, and read the incarnation in the same transaction (the
-- row stays locked until COMMIT). No p_owner_container here: a container
-- name that does not exist would get the sandbox released.
BEGIN;
SELECT sandbox_request(:'id', NULL, '{postgres,redis}', '{"postgres":["pg_trgm"]}',
                       p_idle_timeout => '30 min') AS generation \gset
SELECT incarnation FROM sandbox_desired WHERE id = :'id' \gset
COMMIT;
\echo requested :id at generation :generation, incarnation :incarnation

-- 2. Wait. psql variables are not interpolated inside $$ bodies, so they
-- go in as settings of this session. Under READ COMMITTED every statement
-- of the block takes a fresh snapshot, so each pass sees what sandboxd has
-- committed since; clock_timestamp() moves, now() would not.
SELECT set_config('example.id', :'id', false),
       set_config('example.generation', :'generation', false),
       set_config('example.incarnation', :'incarnation', false),
       set_config('example.timeout', :'timeout', false) \g /dev/null
\echo waiting for :id to be ready (at most :timeout s)
DO $$
DECLARE
    v_id          text        := current_setting('example.id');
    v_generation  bigint      := current_setting('example.generation')::bigint;
    v_incarnation uuid        := current_setting('example.incarnation')::uuid;
    started       timestamptz := clock_timestamp();
    deadline      timestamptz := clock_timestamp()
                                 + make_interval(secs => current_setting('example.timeout')::int);
    s             record;
BEGIN
    LOOP
        SELECT phase, observed_generation, incarnation, message INTO s
        FROM sandbox_status WHERE id = v_id;
        -- Only the status of this incarnation at this generation counts.
        IF FOUND AND s.incarnation = v_incarnation AND s.observed_generation >= v_generation THEN
            EXIT WHEN s.phase = 'ready';
            IF s.phase = 'failed' THEN
                RAISE EXCEPTION 'sandbox % failed: %', v_id, s.message;
            END IF;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM sandbox_desired
                       WHERE id = v_id AND incarnation = v_incarnation) THEN
            RAISE EXCEPTION 'sandbox % was released while waiting for it', v_id;
        END IF;
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'sandbox % is not ready after % s: phase %, observed generation % of %: %',
                v_id, current_setting('example.timeout'), coalesce(s.phase, 'none (no status yet)'),
                s.observed_generation, v_generation, coalesce(nullif(s.message, ''), '(no message)');
        END IF;
        PERFORM pg_sleep(0.5);
    END LOOP;
    PERFORM set_config('example.waited',
                       round(extract(epoch FROM clock_timestamp() - started), 1)::text, false);
END
$$;

-- 3. Read where it answers. host_port is published on 127.0.0.1 for
-- clients on the Docker host (host/port are for the sandbox's network).
SELECT current_setting('example.waited') AS waited,
       services->'postgres'->>'host_port' AS pg_port,
       services->'postgres'->>'user'      AS pg_user,
       services->'postgres'->>'password'  AS pg_password,
       services->'postgres'->>'database'  AS pg_database,
       services->'redis'->>'host_port'    AS redis_port
FROM sandbox_status
WHERE id = :'id' AND incarnation = :'incarnation' AND phase = 'ready' \gset
\echo ready :id after :waited s: postgres on 127.0.0.1::pg_port, redis on 127.0.0.1::redis_port

-- 4. Use its Postgres as the agent would. pg_trgm was requested, so it is
-- installed already (IF NOT EXISTS makes an agent's own CREATE a no-op).
\setenv PGPASSWORD :pg_password
\connect -reuse-previous=off :pg_database :pg_user 127.0.0.1 :pg_port
\setenv PGPASSWORD
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_trgm;
SELECT current_user AS agent, similarity('sandbox', 'sandboxd') AS similarity \gset
\echo connected to the sandbox postgres as :agent: pg_trgm similarity of sandbox and sandboxd = :similarity

-- 5. Back to the state database: still in use (no new generation), then done.
\connect :state_url
SELECT sandbox_touch(:'id') AS touched \gset
\if :touched
\echo touched :id
\else
DO $$ BEGIN RAISE EXCEPTION 'sandbox_touch returned false: the sandbox is gone or being released'; END $$;
\endif
SELECT sandbox_release(:'id') AS released \gset
\if :released
\echo released :id
\else
DO $$ BEGIN RAISE EXCEPTION 'sandbox_release returned false: no such row'; END $$;
\endif
