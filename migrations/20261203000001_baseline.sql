-- sandboxd: the state database's tables, indexes and first rows.
--
-- Migrations hold what has data: tables, sequences, indexes, the rows the
-- tables start with, and later changes of those. What has none lives in
-- sql/, one object per file, and is applied after every migration (see
-- sql/README.md): functions, triggers, row-level security policies and
-- grants. So a function is changed by editing its one file.
--
-- This baseline folds the 14 migrations that came before it (kept, as
-- history, in tests/fixtures/legacy-migrations/); `sandboxd migrate`
-- adopts a database they made.
--
-- The contract with orchestrators: sandbox_desired is written by
-- orchestrators; sandbox_status by sandboxd. The controller runs as an
-- ordinary role that owns every table here; orchestrators are other roles,
-- registered with sandbox_grant_orchestrator.

-- The allowlist: `sandboxd migrate` (and every controller start) rewrites
-- it from the engine registry compiled into the binary, so the database and
-- the controller always agree on what is allowed.
CREATE TABLE sandbox_engines (
    engine text PRIMARY KEY
);

CREATE TABLE sandbox_engine_features (
    engine  text NOT NULL REFERENCES sandbox_engines (engine) ON DELETE CASCADE,
    feature text NOT NULL,
    PRIMARY KEY (engine, feature)
);

-- A first allowlist; the controller re-syncs it at start.
INSERT INTO sandbox_engines (engine) VALUES ('postgres'), ('redis'), ('mongo');
INSERT INTO sandbox_engine_features (engine, feature) VALUES
    ('postgres', 'vector'), ('postgres', 'postgis'), ('postgres', 'pg_trgm'),
    ('postgres', 'citext'), ('postgres', 'uuid-ossp'),
    ('redis', 'search'), ('redis', 'json'), ('redis', 'bloom');

-- What orchestrators ask for. The validation triggers check every column
-- and own generation, created_at, updated_at, last_used_at, requested_at
-- and incarnation.
CREATE TABLE sandbox_desired (
    id              text PRIMARY KEY,
    -- An insert that names no owner is owned by the role that inserts it.
    owner           text NOT NULL DEFAULT current_user,
    services        text[] NOT NULL,
    features        jsonb NOT NULL DEFAULT '{}'::jsonb,
    expires_at      timestamptz NULL,
    generation      bigint NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- Containers (the orchestrator's agents) sandboxd connects to the
    -- sandbox's Docker network.
    attach          text[] NOT NULL DEFAULT '{}',
    -- When the sandbox was last requested or touched.
    last_used_at    timestamptz NOT NULL DEFAULT now(),
    -- NULL: the controller's default (--idle-timeout); zero: never idle-released.
    idle_timeout    interval NULL,
    -- Data on a named Docker volume instead of tmpfs; fixed at insert.
    persistent      boolean NOT NULL DEFAULT false,
    -- The agent's Docker container: when it is gone the sandbox is released.
    owner_container text NULL,
    -- The time of the last sandbox_request.
    requested_at    timestamptz NULL,
    -- A random uuid per row, new on every insert and kept on every update:
    -- a row deleted and inserted again is another incarnation.
    incarnation     uuid NOT NULL DEFAULT gen_random_uuid(),
    -- What an idle sandbox becomes: torn down, or frozen with its data.
    idle_action     text NOT NULL DEFAULT 'release'
        CONSTRAINT sandbox_desired_idle_action_check CHECK (idle_action IN ('release', 'pause')),
    CONSTRAINT sandbox_desired_incarnation_key UNIQUE (incarnation)
);

-- What sandboxd made of each row. Every write carries the writer's leader
-- term (leader_term), which the fence trigger checks.
CREATE TABLE sandbox_status (
    id                  text PRIMARY KEY,
    phase               text NOT NULL
        CONSTRAINT sandbox_status_phase_check
        CHECK (phase IN ('pending', 'provisioning', 'healing', 'ready', 'failed', 'terminating', 'paused')),
    observed_generation bigint NOT NULL DEFAULT 0,
    message             text NOT NULL DEFAULT '',
    services            jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- The Docker network the sandbox's engines are reachable on.
    network             text NULL,
    incarnation         uuid NULL,
    leader_term         bigint NULL
);

-- Orchestrator roles registered by sandbox_grant_orchestrator. Roles are
-- cluster-wide and the controller's role cannot create them, so registration
-- is by name; only the owner (the controller) reads or writes this table.
CREATE TABLE sandbox_orchestrators (
    role          name PRIMARY KEY,
    own_rows_only boolean NOT NULL DEFAULT false
);

-- The identity of this state database: one random uuid, made here. The
-- controller labels every container, network and volume it creates with
-- it and never touches one that carries another identity. A dump restored
-- elsewhere keeps it: it is the same state. The row cannot change.
CREATE TABLE sandbox_identity (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    state_id   uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO sandbox_identity DEFAULT VALUES;

-- One leader per state database: a single row with the holder, a term (a
-- fencing token, one more at every acquisition) and an expiry on the
-- database's clock. Every step is a single statement, so the lease works
-- behind a transaction pooler.
CREATE TABLE sandbox_leader (
    -- One row at most.
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    holder      text NOT NULL CHECK (length(holder) BETWEEN 1 AND 200),
    term        bigint NOT NULL CHECK (term > 0),
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

COMMENT ON TABLE sandbox_leader IS
    'The sandboxd leader lease: holder, term (a fencing token) and expiry; written only through sandbox_lease_* by sandboxd';

-- The reaping circuit breaker: when one look at the fleet finds too many
-- sandboxes whose row vanished without being deleted, the controller
-- pauses reaping and records why here, so the pause outlives a restart.
CREATE TABLE sandbox_reaping (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    paused     boolean NOT NULL DEFAULT false,
    reason     text NOT NULL DEFAULT '',
    paused_at  timestamptz NULL,
    resumed_at timestamptz NULL,
    resumed_by text NULL
);

INSERT INTO sandbox_reaping DEFAULT VALUES;

COMMENT ON TABLE sandbox_reaping IS
    'Whether sandboxd has paused reaping deleted rows (its circuit breaker tripped), why, and who resumed it';

-- Tombstones: the ids of rows removed by DELETE. sandboxd prunes them after
-- a week.
CREATE TABLE sandbox_released (
    id          text PRIMARY KEY,
    released_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE sandbox_released IS
    'Ids whose desired row was deleted row by row (not truncated): sandboxd reaps them without counting them against its reaping breaker';

-- Claims of warm-pool containers: Docker labels cannot change, so which
-- sandbox a claimed container now serves is recorded here, before the
-- controller touches the container. Fenced by leader term.
CREATE TABLE sandbox_pool_claims (
    container   text PRIMARY KEY CHECK (length(container) BETWEEN 1 AND 128),
    sandbox_id  text NOT NULL,
    engine      text NOT NULL,
    generation  bigint NOT NULL,
    incarnation text NULL,
    owner       text NOT NULL DEFAULT '',
    features    text[] NOT NULL DEFAULT '{}',
    instance    text NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    leader_term bigint NULL
);

CREATE INDEX sandbox_pool_claims_sandbox ON sandbox_pool_claims (sandbox_id);

COMMENT ON TABLE sandbox_pool_claims IS
    'Warm-pool containers claimed by a sandbox (container id -> sandbox): Docker labels cannot change, so the claim lives here; written only by the sandboxd leader';

-- What sandboxd did to each sandbox, as events, written only through
-- sandbox_record_events. Events carry the row's owner at the time, so an
-- own-rows-only orchestrator still sees the events of a sandbox it
-- released (until they age out).
CREATE TABLE sandbox_events (
    seq         bigserial PRIMARY KEY,
    sandbox_id  text NOT NULL CHECK (length(sandbox_id) BETWEEN 1 AND 63),
    incarnation uuid NULL,
    owner       text NOT NULL DEFAULT '',
    first_at    timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz NOT NULL DEFAULT now(),
    count       integer NOT NULL DEFAULT 1 CHECK (count >= 1),
    reason      text NOT NULL CHECK (reason ~ '^[a-z_]{1,32}$'),
    engine      text NULL CHECK (length(engine) <= 32),
    detail      text NULL CHECK (length(detail) <= 64),
    message     text NOT NULL CHECK (length(message) <= 1000),
    leader_term bigint NOT NULL
);

CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, seq);
CREATE INDEX sandbox_events_last_at ON sandbox_events (last_at);

COMMENT ON TABLE sandbox_events IS
    'What sandboxd did to each sandbox (provisioned, claimed, healed, rotated, reaped, failed, backoff), newest last by seq; bounded per sandbox, pruned by age, never a credential; written only by the sandboxd leader';

-- Per-owner quotas. The reserved owner '*' holds the default for every
-- owner without a row of its own; an owner's row replaces it as a whole;
-- NULL is unlimited. Written by the operator (`sandboxd quota set|unset`).
CREATE TABLE sandbox_quotas (
    owner            text PRIMARY KEY
        CHECK (length(owner) BETWEEN 1 AND 200 AND owner !~ '[[:cntrl:]]'),
    max_sandboxes    integer NULL CHECK (max_sandboxes >= 0),
    max_memory_bytes bigint NULL CHECK (max_memory_bytes >= 0),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE sandbox_quotas IS
    'Per-owner limits on admitted sandboxes and the sum of their memory caps; owner ''*'' is the default, an owner''s row replaces it, NULL is unlimited; written by the operator (sandboxd quota set)';

-- Checkpoints and resets of a sandbox's data. One row of limits (the table
-- owner may change them).
CREATE TABLE sandbox_checkpoint_settings (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    max_per_sandbox integer NOT NULL DEFAULT 8 CHECK (max_per_sandbox BETWEEN 0 AND 64)
);
INSERT INTO sandbox_checkpoint_settings DEFAULT VALUES;

-- Request numbers of both verbs, in the order they were asked.
CREATE SEQUENCE sandbox_checkpoint_requests;

CREATE TABLE sandbox_checkpoints (
    sandbox_id   text NOT NULL CHECK (length(sandbox_id) BETWEEN 1 AND 63),
    name         text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,30}$' AND name <> 'baseline'),
    owner        text NOT NULL,
    incarnation  uuid NULL,
    request      bigint NOT NULL,
    state        text NOT NULL DEFAULT 'requested' CHECK (state IN ('requested', 'ready', 'failed')),
    message      text NOT NULL DEFAULT '' CHECK (length(message) <= 1000),
    -- What the checkpoint takes in the sandbox's memory (all engines).
    size_bytes   bigint NULL CHECK (size_bytes >= 0),
    -- The containers (engine -> instance token) that hold it: a heal
    -- starts a new container, whose data the checkpoint is not in.
    instances    jsonb NOT NULL DEFAULT '{}'::jsonb,
    requested_at timestamptz NOT NULL DEFAULT now(),
    done_at      timestamptz NULL,
    PRIMARY KEY (sandbox_id, name)
);

CREATE TABLE sandbox_resets (
    request      bigint PRIMARY KEY,
    sandbox_id   text NOT NULL CHECK (length(sandbox_id) BETWEEN 1 AND 63),
    -- 'baseline' or a checkpoint's name.
    checkpoint   text NOT NULL CHECK (checkpoint ~ '^[a-z0-9][a-z0-9_-]{0,30}$'),
    owner        text NOT NULL,
    incarnation  uuid NULL,
    state        text NOT NULL DEFAULT 'requested' CHECK (state IN ('requested', 'done', 'failed')),
    message      text NOT NULL DEFAULT '' CHECK (length(message) <= 1000),
    requested_at timestamptz NOT NULL DEFAULT now(),
    done_at      timestamptz NULL
);
CREATE INDEX sandbox_resets_pending ON sandbox_resets (sandbox_id) WHERE state = 'requested';

-- Every privilege sandbox_grant_orchestrator gives a role, and (privilege
-- NULL) the objects an orchestrator never gets, whose privileges
-- sandbox_revoke_orchestrator still removes. Its rows are written by
-- sql/grants/orchestrator_privileges.sql.
CREATE TABLE sandbox_orchestrator_privileges (
    object_kind text NOT NULL CHECK (object_kind IN ('schema', 'table', 'sequence', 'function')),
    object      text NOT NULL CHECK (length(object) BETWEEN 1 AND 300),
    -- NULL: nothing is granted; revoke removes all privileges on it.
    privilege   text NULL,
    CONSTRAINT sandbox_orchestrator_privileges_fit CHECK (
        privilege IS NULL
        OR (object_kind = 'schema' AND privilege = 'USAGE')
        OR (object_kind = 'table' AND privilege IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE'))
        OR (object_kind = 'sequence' AND privilege IN ('USAGE', 'SELECT', 'UPDATE'))
        OR (object_kind = 'function' AND privilege = 'EXECUTE'))
);
CREATE UNIQUE INDEX sandbox_orchestrator_privileges_once
    ON sandbox_orchestrator_privileges (object_kind, object, coalesce(privilege, ''));
