-- sandboxd: pause on idle, resume on use (issue 14, part 2).
--
-- * sandbox_desired.idle_action: what an idle sandbox becomes, 'release'
--   (torn down, as before; the default) or 'pause' (its containers frozen
--   with their data and credentials, status 'paused'). A change of it is a
--   change of what is asked: a new generation.
-- * sandbox_status.phase gains 'paused'.
-- * sandbox_request gains p_idle_action (NULL keeps the row's): a new
--   signature, so the old one is dropped; migration 14 lists the new one
--   among what sandbox_grant_orchestrator grants.
-- * sandbox_touch wakes the controller (NOTIFY sandbox_desired) when it
--   touches a row that asks to pause and is paused or may be being paused
--   (idle by now): that touch is what resumes it. Other touches stay silent.

ALTER TABLE sandbox_desired ADD COLUMN idle_action text NOT NULL DEFAULT 'release'
    CONSTRAINT sandbox_desired_idle_action_check CHECK (idle_action IN ('release', 'pause'));

-- The phase constraint, found by what it checks (as in migration 03).
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
    CHECK (phase IN ('pending', 'provisioning', 'healing', 'ready', 'failed', 'terminating', 'paused'));

-- Checks idle_action with a message that says what to do (the CHECK above
-- is the backstop) and makes its change a new generation. Fires after
-- sandbox_desired_validate and before sandbox_desired_validate_lifecycle
-- (triggers fire in name order), which then moves last_used_at with the
-- new generation.
CREATE FUNCTION sandbox_desired_validate_idle_action() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.idle_action IS NULL OR NEW.idle_action NOT IN ('release', 'pause') THEN
        RAISE EXCEPTION 'idle_action of sandbox % is %: use ''release'' (torn down once idle) or ''pause'' (frozen once idle, resumed by a request or a touch)',
            NEW.id, sandbox_quote(NEW.idle_action)
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.generation = OLD.generation
       AND NEW.idle_action IS DISTINCT FROM OLD.idle_action THEN
        NEW.generation := OLD.generation + 1;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_desired_validate_idle_action
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_validate_idle_action();

-- Migration 03's sandbox_request with p_idle_action (NULL: keep the row's;
-- for a new row 'release').
DROP FUNCTION sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[]);
CREATE FUNCTION sandbox_request(
    p_id text,
    p_owner text,
    p_services text[],
    p_features jsonb DEFAULT '{}',
    p_idle_timeout interval DEFAULT NULL,
    p_persistent boolean DEFAULT NULL,
    p_owner_container text DEFAULT NULL,
    p_attach text[] DEFAULT NULL,
    p_idle_action text DEFAULT NULL
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
                idle_action     = coalesce(p_idle_action, cur.idle_action),
                requested_at    = greatest(clock_timestamp(),
                                           cur.requested_at + interval '1 microsecond'),
                last_used_at    = now()
            WHERE d.id = p_id
            RETURNING d.generation INTO v_generation;
            RETURN v_generation;
        END IF;

        INSERT INTO sandbox_desired AS d
            (id, owner, services, features, attach, idle_timeout, persistent, owner_container,
             requested_at, idle_action)
        VALUES (p_id, coalesce(p_owner, current_user),
                sandbox_array_union('{}', p_services),
                sandbox_features_union('{}', p_features),
                sandbox_array_union('{}', p_attach),
                p_idle_timeout, coalesce(p_persistent, false), p_owner_container, clock_timestamp(),
                coalesce(p_idle_action, 'release'))
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

-- Migration 03's sandbox_touch, plus the wake-up: a row that asks to pause
-- and whose status is `paused`, or that was idle by the time of the touch
-- (the controller may be pausing it right now; a NULL idle_timeout is the
-- controller's, unknown here, so such rows always notify), sends NOTIFY
-- sandbox_desired so that the controller resumes it at once.
CREATE OR REPLACE FUNCTION sandbox_touch(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    before_touch record;
BEGIN
    UPDATE sandbox_desired d SET last_used_at = now()
    FROM (SELECT o.id, o.last_used_at, o.idle_timeout FROM sandbox_desired o
          WHERE o.id = p_id) old
    WHERE d.id = old.id
      AND (d.persistent OR d.expires_at IS NULL OR d.expires_at > now())
      AND NOT EXISTS (SELECT 1 FROM sandbox_status s
                      WHERE s.id = d.id AND s.phase = 'terminating')
    RETURNING d.idle_action, old.last_used_at, old.idle_timeout INTO before_touch;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF before_touch.idle_action = 'pause'
       AND (before_touch.idle_timeout IS NULL
            OR before_touch.last_used_at + before_touch.idle_timeout <= now() + interval '5 seconds'
            OR EXISTS (SELECT 1 FROM sandbox_status s WHERE s.id = p_id AND s.phase = 'paused')) THEN
        PERFORM pg_notify('sandbox_desired', p_id);
    END IF;
    RETURN true;
END
$$;

-- Orchestrators get the new sandbox_request, and revoke takes away the
-- new trigger function, through sandbox_orchestrator_privileges
-- (migration 14), which sandbox_grant_orchestrator and
-- sandbox_revoke_orchestrator apply.

REVOKE EXECUTE ON FUNCTION sandbox_desired_validate_idle_action(),
    sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[], text),
    sandbox_touch(text)
    FROM PUBLIC;

-- Orchestrators registered before this migration may call the new
-- sandbox_request (the old one's grants went with it).
DO $$
DECLARE
    role_name name;
BEGIN
    FOR role_name IN
        SELECT o.role FROM sandbox_orchestrators o
        WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[], text) '
                       'TO %I', role_name);
    END LOOP;
END
$$;

-- Pin the search_path of the new and replaced functions (CREATE OR
-- REPLACE drops their settings), pg_temp last.
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'sandbox_desired_validate_idle_action()',
        'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[], text)',
        'sandbox_touch(text)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;
