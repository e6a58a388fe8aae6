-- sandboxd: the additive request verb, touch, release, and the columns for
-- idle timeouts, persistent sandboxes and an owner container.
--
-- * sandbox_request(id, owner, services, features, ...) adds to what a row
--   asks (the Python provisioner's request_sandbox): it inserts the row if
--   absent and otherwise unions services, features and attach, never
--   removing anything; every call bumps `generation`, so a caller always
--   has a generation to wait for and the controller retries a failed
--   sandbox at once.
-- * sandbox_touch(id) records a use (last_used_at) without a new
--   generation; sandbox_release(id) deletes the row.
-- * A second BEFORE trigger, sandbox_desired_validate_lifecycle, checks the
--   new columns and extends the generation rules; it fires after
--   sandbox_desired_validate (triggers fire in name order).
-- * NOTIFY sandbox_desired fires on insert, delete and on updates that
--   change `generation` only: a touch does not wake the controller.
--
-- Unqualified names resolve to the tables' schema, as in the earlier
-- migrations; the DO block at the end pins every function's search_path.

-- When the sandbox was last requested or touched (set by the database).
ALTER TABLE sandbox_desired ADD COLUMN last_used_at timestamptz NOT NULL DEFAULT now();
-- NULL: the controller's default (--idle-timeout); zero: never idle-released.
ALTER TABLE sandbox_desired ADD COLUMN idle_timeout interval NULL;
-- Data on a named Docker volume instead of tmpfs; fixed at insert.
ALTER TABLE sandbox_desired ADD COLUMN persistent boolean NOT NULL DEFAULT false;
-- The agent's Docker container: when it is gone the sandbox is released.
ALTER TABLE sandbox_desired ADD COLUMN owner_container text NULL;
-- The time of the last sandbox_request (set by the database).
ALTER TABLE sandbox_desired ADD COLUMN requested_at timestamptz NULL;

-- sandbox_status.phase gains 'healing' (an engine that was ready died and
-- is being re-created with the same credentials). The constraint is found
-- by what it checks rather than by its generated name.
DO $$
DECLARE
    constraint_name name;
BEGIN
    FOR constraint_name IN
        SELECT c.conname FROM pg_constraint c
        WHERE c.conrelid = 'sandbox_status'::regclass AND c.contype = 'c'
          AND pg_get_constraintdef(c.oid) LIKE '%phase%'
    LOOP
        EXECUTE format('ALTER TABLE sandbox_status DROP CONSTRAINT %I', constraint_name);
    END LOOP;
END
$$;
ALTER TABLE sandbox_status ADD CONSTRAINT sandbox_status_phase_check
    CHECK (phase IN ('pending', 'provisioning', 'healing', 'ready', 'failed', 'terminating'));

-- Checks the lifecycle columns and owns last_used_at and requested_at;
-- on UPDATE bumps `generation` when idle_timeout, owner_container or
-- requested_at changed and sandbox_desired_validate did not bump it already.
CREATE FUNCTION sandbox_desired_validate_lifecycle() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- idle_timeout at most this many seconds (365 days).
    max_idle_seconds CONSTANT numeric := 31536000;
    idle_seconds numeric;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.id IS DISTINCT FROM OLD.id THEN
        RAISE EXCEPTION 'the id of sandbox % cannot change: release it (sandbox_release) and request % as a new sandbox',
            OLD.id, NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- idle_timeout: NULL (the controller's default) or 0 to 365 days, stored
    -- as a plain duration (no months or days), so that the controller and
    -- SQL agree on when it has passed.
    IF NEW.idle_timeout IS NOT NULL THEN
        IF NOT isfinite(NEW.idle_timeout) THEN
            RAISE EXCEPTION 'idle_timeout of sandbox % is %: use an interval from 0 (never idle-released) to 365 days, or NULL for the controller''s default (--idle-timeout)',
                NEW.id, NEW.idle_timeout
                USING ERRCODE = 'check_violation';
        END IF;
        idle_seconds := EXTRACT(EPOCH FROM NEW.idle_timeout);
        IF idle_seconds < 0 OR idle_seconds > max_idle_seconds THEN
            RAISE EXCEPTION 'idle_timeout of sandbox % is %: use an interval from 0 (never idle-released) to 365 days, or NULL for the controller''s default (--idle-timeout)',
                NEW.id, NEW.idle_timeout
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.idle_timeout := (idle_seconds * 1000000)::bigint * interval '1 microsecond';
    END IF;

    -- owner_container: a Docker container name, like the attach entries.
    IF NEW.owner_container IS NOT NULL
       AND NEW.owner_container !~ '^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid owner_container % of sandbox %: use a Docker container name, 1 to 128 characters from a-z, A-Z, 0-9, "_", "." and "-", starting with a letter or digit, or NULL for none',
            sandbox_quote(NEW.owner_container), NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- persistent: fixed at insert (its data lives on a volume of its own).
    IF NEW.persistent IS NULL THEN
        RAISE EXCEPTION 'persistent of sandbox % is NULL: use true (data on a Docker volume) or false (data on tmpfs)', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.persistent <> OLD.persistent THEN
        RAISE EXCEPTION 'persistent of sandbox % cannot change (it is %): release the sandbox (sandbox_release; this discards its data) and request it again with persistent = %',
            NEW.id, OLD.persistent::text, NEW.persistent::text
            USING ERRCODE = 'check_violation';
    END IF;

    IF TG_OP = 'INSERT' THEN
        IF NEW.requested_at IS NOT NULL THEN
            NEW.requested_at := clock_timestamp();
        END IF;
        NEW.last_used_at := now();
        RETURN NEW;
    END IF;

    -- requested_at only ever moves forward, to the time of the write.
    IF NEW.requested_at IS NOT NULL AND NEW.requested_at IS DISTINCT FROM OLD.requested_at THEN
        NEW.requested_at := greatest(clock_timestamp(),
                                     coalesce(OLD.requested_at + interval '1 microsecond', '-infinity'));
    END IF;
    IF NEW.generation = OLD.generation
       AND (NEW.idle_timeout, NEW.owner_container, NEW.requested_at)
           IS DISTINCT FROM (OLD.idle_timeout, OLD.owner_container, OLD.requested_at) THEN
        NEW.generation := OLD.generation + 1;
        NEW.updated_at := now();
    END IF;
    IF NEW.generation <> OLD.generation THEN
        NEW.last_used_at := now();
    ELSE
        -- At most now, and never backwards.
        NEW.last_used_at := greatest(OLD.last_used_at,
                                     least(coalesce(NEW.last_used_at, OLD.last_used_at), now()));
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_desired_validate_lifecycle
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_validate_lifecycle();

-- NOTIFY only for what the controller must act on: a new row, a deleted
-- one, a new generation. A touch (last_used_at only) stays silent.
DROP TRIGGER sandbox_desired_notify ON sandbox_desired;
CREATE TRIGGER sandbox_desired_notify
    AFTER INSERT OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_notify('sandbox_desired');
CREATE TRIGGER sandbox_desired_notify_generation
    AFTER UPDATE ON sandbox_desired
    FOR EACH ROW WHEN (OLD.generation IS DISTINCT FROM NEW.generation)
    EXECUTE FUNCTION sandbox_notify('sandbox_desired');

-- `existing` in order, then the entries of `added` it lacks, each once in
-- the order first given. NULL entries are kept (once), so that the
-- validation trigger refuses them.
CREATE FUNCTION sandbox_array_union(existing text[], added text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(entry ORDER BY source, position), '{}')
    FROM (
        SELECT DISTINCT ON (entry) entry, source, position
        FROM (
            SELECT e.entry, 1 AS source, e.position
            FROM unnest(existing) WITH ORDINALITY AS e(entry, position)
            UNION ALL
            SELECT a.entry, 2, a.position
            FROM unnest(added) WITH ORDINALITY AS a(entry, position)
        ) both_lists
        ORDER BY entry, source, position
    ) firsts
$$;

-- Per engine, the union of two feature maps ({"engine": ["feature", ...]},
-- each value an array of strings): every array sorted, each feature once.
CREATE FUNCTION sandbox_features_union(existing jsonb, added jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(engines.engine, (
               SELECT coalesce(to_jsonb(array_agg(f.feature ORDER BY f.feature)), '[]'::jsonb)
               FROM (
                   SELECT DISTINCT x.feature COLLATE "C" AS feature
                   FROM (
                       SELECT jsonb_array_elements_text(coalesce(existing -> engines.engine, '[]'))
                       UNION ALL
                       SELECT jsonb_array_elements_text(coalesce(added -> engines.engine, '[]'))
                   ) x(feature)
               ) f)),
           '{}'::jsonb)
    FROM (
        SELECT jsonb_object_keys(coalesce(existing, '{}'))
        UNION
        SELECT jsonb_object_keys(coalesce(added, '{}'))
    ) engines(engine)
$$;

-- The additive verb: inserts the row if absent (owner: p_owner, else the
-- calling role), otherwise adds to what it asks: services and attach are
-- the row's, then the new ones appended; features are the per-engine
-- union; idle_timeout and owner_container are replaced only when given;
-- persistent and owner, when given, must equal the row's. Never removes
-- anything and leaves expires_at alone (an expired row, unless persistent,
-- is refused: set a later expires_at, or release it first). Every call sets requested_at
-- and last_used_at and so bumps `generation`, which it returns: the
-- generation to wait for. SECURITY INVOKER: row-level security applies.
CREATE FUNCTION sandbox_request(
    p_id text,
    p_owner text,
    p_services text[],
    p_features jsonb DEFAULT '{}',
    p_idle_timeout interval DEFAULT NULL,
    p_persistent boolean DEFAULT NULL,
    p_owner_container text DEFAULT NULL,
    p_attach text[] DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    -- The validation trigger's limits, checked here before any
    -- per-element work on the arguments.
    max_features CONSTANT integer := 16;
    max_attach   CONSTANT integer := 16;
    n_engines    integer := (SELECT count(*) FROM sandbox_engines);
    cur          sandbox_desired%ROWTYPE;
    v_generation bigint;
    eng          text;
    val          jsonb;
BEGIN
    IF p_id IS NULL OR p_id !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid sandbox id %: use 1 to 63 characters from a-z, 0-9, "-" and "_", starting with a letter or digit',
            sandbox_quote(p_id)
            USING ERRCODE = 'check_violation';
    END IF;

    p_services := coalesce(p_services, '{}');
    IF cardinality(p_services) > n_engines THEN
        RAISE EXCEPTION 'services requested for sandbox % list % entries, but there are only % engines: list each of % at most once',
            p_id, cardinality(p_services), n_engines, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    IF cardinality(p_services) > 0
       AND (array_ndims(p_services) <> 1 OR array_lower(p_services, 1) <> 1) THEN
        RAISE EXCEPTION 'services requested for sandbox % must be a one-dimensional list starting at index 1, e.g. ''{postgres,redis}'', of: %',
            p_id, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;

    p_features := coalesce(p_features, '{}');
    IF jsonb_typeof(p_features) <> 'object' THEN
        RAISE EXCEPTION 'features requested for sandbox % must be a JSON object mapping engine to an array of feature names, e.g. {"postgres":["pg_trgm"],"redis":["search"]}', p_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF (SELECT count(*) FROM jsonb_object_keys(p_features)) > n_engines THEN
        RAISE EXCEPTION 'features requested for sandbox % name more engines than there are (%): allowed engines are %',
            p_id, n_engines, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    FOR eng, val IN SELECT key, value FROM jsonb_each(p_features) LOOP
        IF jsonb_typeof(val) <> 'array' THEN
            RAISE EXCEPTION 'features requested for sandbox % for engine % must be a JSON array of feature names; allowed features are %',
                p_id, sandbox_quote(eng), sandbox_allowed_features(eng)
                USING ERRCODE = 'check_violation';
        END IF;
        IF jsonb_array_length(val) > max_features THEN
            RAISE EXCEPTION 'features requested for sandbox % for engine % list % entries: at most % features per engine are allowed, each once, of: %',
                p_id, sandbox_quote(eng), jsonb_array_length(val), max_features, sandbox_allowed_features(eng)
                USING ERRCODE = 'check_violation';
        END IF;
        IF EXISTS (SELECT 1 FROM jsonb_array_elements(val) e WHERE jsonb_typeof(e) <> 'string') THEN
            RAISE EXCEPTION 'features requested for sandbox % for engine % must be strings: allowed features are %',
                p_id, sandbox_quote(eng), sandbox_allowed_features(eng)
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;

    p_attach := coalesce(p_attach, '{}');
    IF cardinality(p_attach) > max_attach THEN
        RAISE EXCEPTION 'attach requested for sandbox % lists % containers: at most % are allowed',
            p_id, cardinality(p_attach), max_attach
            USING ERRCODE = 'check_violation';
    END IF;
    IF cardinality(p_attach) > 0
       AND (array_ndims(p_attach) <> 1 OR array_lower(p_attach, 1) <> 1) THEN
        RAISE EXCEPTION 'attach requested for sandbox % must be a one-dimensional list of container names starting at index 1, e.g. ''{agent-7}''', p_id
            USING ERRCODE = 'check_violation';
    END IF;

    -- Update the row if this role sees it; otherwise insert it. A
    -- concurrent first request that wins the insert makes this one an
    -- update on the next pass.
    FOR attempt IN 1..3 LOOP
        SELECT * INTO cur FROM sandbox_desired d WHERE d.id = p_id FOR UPDATE;
        IF FOUND THEN
            IF p_owner IS NOT NULL AND p_owner IS DISTINCT FROM cur.owner THEN
                RAISE EXCEPTION 'sandbox % belongs to another owner: request it without an owner (NULL), or use another id', p_id
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            IF p_persistent IS NOT NULL AND p_persistent <> cur.persistent THEN
                RAISE EXCEPTION 'sandbox % is % and persistent cannot change: request it with persistent NULL or %, or release it (sandbox_release; this discards its data) and request it again',
                    p_id, CASE WHEN cur.persistent THEN 'persistent' ELSE 'not persistent' END, cur.persistent::text
                    USING ERRCODE = 'check_violation';
            END IF;
            IF cur.expires_at <= now() AND NOT cur.persistent THEN
                RAISE EXCEPTION 'sandbox % expired at %: set a later expires_at (UPDATE sandbox_desired SET expires_at = ...), or release it (sandbox_release) and request it again',
                    p_id, cur.expires_at
                    USING ERRCODE = 'check_violation';
            END IF;
            UPDATE sandbox_desired d SET
                services        = sandbox_array_union(cur.services, p_services),
                features        = sandbox_features_union(cur.features, p_features),
                attach          = sandbox_array_union(cur.attach, p_attach),
                idle_timeout    = coalesce(p_idle_timeout, cur.idle_timeout),
                owner_container = coalesce(p_owner_container, cur.owner_container),
                requested_at    = greatest(clock_timestamp(),
                                           cur.requested_at + interval '1 microsecond'),
                last_used_at    = now()
            WHERE d.id = p_id
            RETURNING d.generation INTO v_generation;
            RETURN v_generation;
        END IF;

        INSERT INTO sandbox_desired AS d
            (id, owner, services, features, attach, idle_timeout, persistent, owner_container, requested_at)
        VALUES (p_id, coalesce(p_owner, current_user),
                sandbox_array_union('{}', p_services),
                sandbox_features_union('{}', p_features),
                sandbox_array_union('{}', p_attach),
                p_idle_timeout, coalesce(p_persistent, false), p_owner_container, clock_timestamp())
        ON CONFLICT (id) DO NOTHING
        RETURNING d.generation INTO v_generation;
        IF FOUND THEN
            RETURN v_generation;
        END IF;
    END LOOP;
    -- The id exists, and row-level security hides it from this role.
    RAISE EXCEPTION 'sandbox id % is taken by another owner: use another id (ids are one namespace for every orchestrator)', p_id
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- Records a use: last_used_at = now(), no new generation, no NOTIFY. False
-- (and nothing changes) when there is no such row this role sees, it has
-- expired (a persistent sandbox never does), or it is being released
-- (status `terminating`): request it again.
CREATE FUNCTION sandbox_touch(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
    UPDATE sandbox_desired d SET last_used_at = now()
    WHERE d.id = p_id
      AND (d.persistent OR d.expires_at IS NULL OR d.expires_at > now())
      AND NOT EXISTS (SELECT 1 FROM sandbox_status s
                      WHERE s.id = d.id AND s.phase = 'terminating');
    RETURN FOUND;
END
$$;

-- Deletes the row (sandboxd tears the sandbox down); true if there was one
-- this role sees.
CREATE FUNCTION sandbox_release(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
    DELETE FROM sandbox_desired d WHERE d.id = p_id;
    RETURN FOUND;
END
$$;

-- As in the previous migration, plus EXECUTE on the request functions and
-- what they call as the orchestrator.
CREATE OR REPLACE FUNCTION sandbox_grant_orchestrator(role_name name, own_rows_only boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    IF role_name IS NULL OR own_rows_only IS NULL THEN
        RAISE EXCEPTION 'sandbox_grant_orchestrator needs a role name and own_rows_only true or false'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
        RAISE EXCEPTION 'role % does not exist: create it first as a superuser (CREATE ROLE % LOGIN PASSWORD ''...''), then grant it again',
            quote_ident(role_name), quote_ident(role_name)
            USING ERRCODE = 'undefined_object';
    END IF;
    IF role_name LIKE 'pg\_%' THEN
        RAISE EXCEPTION 'role % is a predefined role: create a role of its own for the orchestrator', quote_ident(role_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF role_name = current_user THEN
        RAISE EXCEPTION 'role % is the role running this function (the owner of sandboxd''s tables): create another role for the orchestrator',
            quote_ident(role_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    PERFORM sandbox_revoke_orchestrator(role_name);

    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, role_name);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE sandbox_desired TO %I', role_name);
    EXECUTE format('GRANT SELECT ON TABLE sandbox_status, sandbox_engines, sandbox_engine_features TO %I', role_name);
    -- What the validation trigger, the policies and the request functions
    -- call as the orchestrator, and the request functions themselves.
    EXECUTE format('GRANT EXECUTE ON FUNCTION sandbox_allowed_engines(), sandbox_allowed_features(text), '
                   'sandbox_quote(text), sandbox_orchestrator_may_access(text, name), '
                   'sandbox_orchestrator_may_see_status(text, name), '
                   'sandbox_array_union(text[], text[]), sandbox_features_union(jsonb, jsonb), '
                   'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[]), '
                   'sandbox_touch(text), sandbox_release(text) TO %I', role_name);
    INSERT INTO sandbox_orchestrators (role, own_rows_only)
    VALUES (role_name, own_rows_only);
END
$$;

CREATE OR REPLACE FUNCTION sandbox_revoke_orchestrator(role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    registered boolean;
BEGIN
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'sandbox_revoke_orchestrator needs a role name'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    DELETE FROM sandbox_orchestrators o WHERE o.role = role_name;
    registered := FOUND;
    IF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
        EXECUTE format('REVOKE ALL ON TABLE sandbox_desired, sandbox_status, sandbox_engines, '
                       'sandbox_engine_features, sandbox_orchestrators FROM %I', role_name);
        EXECUTE format('REVOKE ALL ON FUNCTION sandbox_allowed_engines(), sandbox_allowed_features(text), '
                       'sandbox_quote(text), sandbox_orchestrator_may_access(text, name), '
                       'sandbox_orchestrator_may_see_status(text, name), sandbox_desired_validate(), '
                       'sandbox_desired_validate_lifecycle(), '
                       'sandbox_notify(), sandbox_grant_orchestrator(name, boolean), '
                       'sandbox_revoke_orchestrator(name), '
                       'sandbox_array_union(text[], text[]), sandbox_features_union(jsonb, jsonb), '
                       'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[]), '
                       'sandbox_touch(text), sandbox_release(text) FROM %I', role_name);
        -- Only when this role owns the schema: elsewhere (a public schema
        -- owned by a superuser) the grant was never made.
        IF pg_has_role((SELECT nspowner FROM pg_namespace WHERE nspname = schema_name), 'USAGE') THEN
            EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM %I', schema_name, role_name);
        END IF;
    END IF;
    RETURN registered;
END
$$;

REVOKE EXECUTE ON FUNCTION sandbox_desired_validate_lifecycle(),
    sandbox_array_union(text[], text[]), sandbox_features_union(jsonb, jsonb),
    sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[]),
    sandbox_touch(text), sandbox_release(text),
    sandbox_grant_orchestrator(name, boolean), sandbox_revoke_orchestrator(name)
    FROM PUBLIC;

-- Orchestrators registered before this migration may call the new functions.
DO $$
DECLARE
    role_name name;
BEGIN
    FOR role_name IN
        SELECT o.role FROM sandbox_orchestrators o
        WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       'sandbox_array_union(text[], text[]), sandbox_features_union(jsonb, jsonb), '
                       'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[]), '
                       'sandbox_touch(text), sandbox_release(text) TO %I', role_name);
    END LOOP;
END
$$;

-- Pin the search_path of the new functions and of the two replaced ones
-- (CREATE OR REPLACE drops their settings), pg_temp last.
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'sandbox_desired_validate_lifecycle()',
        'sandbox_array_union(text[], text[])', 'sandbox_features_union(jsonb, jsonb)',
        'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[])',
        'sandbox_touch(text)', 'sandbox_release(text)',
        'sandbox_grant_orchestrator(name, boolean)', 'sandbox_revoke_orchestrator(name)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;
