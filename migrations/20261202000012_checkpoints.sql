-- sandboxd: checkpoints and resets of a sandbox's data.
--
-- * sandbox_checkpoint(id, name) asks sandboxd to record the sandbox's data
--   as checkpoint `name` (every engine of the sandbox that has
--   checkpoints); sandbox_reset(id, name) asks it to bring the data back to
--   a checkpoint, or to the baseline (the empty database with its features,
--   recorded right after provisioning) when name is NULL or 'baseline'.
--   Same credentials and endpoint; connected clients' sessions are closed.
-- * Each returns the request's number; the outcome lands in
--   sandbox_checkpoints (state requested -> ready | failed) or
--   sandbox_resets (requested -> done | failed), with a message, and as an
--   event (checkpointed, reset, failed) in sandbox_events.
-- * Names: ^[a-z0-9][a-z0-9_-]{0,30}$, `baseline` reserved. At most
--   sandbox_checkpoint_settings.max_per_sandbox (default 8) checkpoints per
--   sandbox; taking a checkpoint again under the same name replaces it.
--   sandboxd also refuses a checkpoint that would not fit under the
--   sandbox's memory cap (its data is on tmpfs in the container's cgroup).
-- * Orchestrators see and request only for the rows they may access (row-level
--   security by owner, as sandbox_desired); a trigger checks every row
--   against its sandbox and the limit, whoever writes it.
-- * The functions NOTIFY sandbox_desired with the id: the controller
--   reconciles the sandbox and performs the requests in request order.
--
-- Unqualified names resolve to the tables' schema; the DO block at the end
-- pins the functions' search_path.

-- One row: the limits the functions apply (the table owner may change them).
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

-- A released sandbox's checkpoints and resets go with its row (no foreign
-- key: sandbox_desired may be truncated, migration 04); so do those of
-- every row when the table is truncated. SECURITY DEFINER: orchestrators
-- delete rows, and may not delete these.
CREATE FUNCTION sandbox_checkpoints_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE sandbox_checkpoints, sandbox_resets;
        RETURN NULL;
    END IF;
    DELETE FROM sandbox_checkpoints c WHERE c.sandbox_id = OLD.id;
    DELETE FROM sandbox_resets r WHERE r.sandbox_id = OLD.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER sandbox_desired_forget_checkpoints AFTER DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_checkpoints_forget();
CREATE TRIGGER sandbox_desired_truncate_checkpoints AFTER TRUNCATE ON sandbox_desired
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_checkpoints_forget();

-- Every row written (by the functions, or by an orchestrator directly):
-- its owner and incarnation are its sandbox's, and a new checkpoint stays
-- within the limit. SECURITY DEFINER: it counts rows the writer may not see.
CREATE FUNCTION sandbox_checkpoints_validate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    d record;
    most integer;
    taken integer;
BEGIN
    SELECT s.owner, s.incarnation INTO d FROM sandbox_desired s WHERE s.id = NEW.sandbox_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no sandbox %: request it first (sandbox_request)', NEW.sandbox_id
            USING ERRCODE = 'no_data_found';
    END IF;
    IF NEW.owner IS DISTINCT FROM d.owner THEN
        RAISE EXCEPTION 'the owner of a checkpoint or reset of sandbox % must be the sandbox''s (%)', NEW.sandbox_id, d.owner
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_TABLE_NAME = 'sandbox_checkpoints' AND TG_OP = 'INSERT' THEN
        SELECT c.max_per_sandbox INTO most FROM sandbox_checkpoint_settings c;
        SELECT count(*) INTO taken FROM sandbox_checkpoints c
        WHERE c.sandbox_id = NEW.sandbox_id AND c.name <> NEW.name;
        IF taken >= coalesce(most, 8) THEN
            RAISE EXCEPTION 'sandbox % has % checkpoints, the most a sandbox may have (sandbox_checkpoint_settings.max_per_sandbox = %): take the new one under the name of one you no longer need (it is replaced)',
                NEW.sandbox_id, taken, coalesce(most, 8)
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_checkpoints_validate BEFORE INSERT OR UPDATE ON sandbox_checkpoints
    FOR EACH ROW EXECUTE FUNCTION sandbox_checkpoints_validate();
CREATE TRIGGER sandbox_resets_validate BEFORE INSERT OR UPDATE ON sandbox_resets
    FOR EACH ROW EXECUTE FUNCTION sandbox_checkpoints_validate();

ALTER TABLE sandbox_checkpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY sandbox_checkpoints_orchestrators ON sandbox_checkpoints TO PUBLIC
    USING (sandbox_orchestrator_may_access(owner, current_user))
    WITH CHECK (sandbox_orchestrator_may_access(owner, current_user));
ALTER TABLE sandbox_resets ENABLE ROW LEVEL SECURITY;
CREATE POLICY sandbox_resets_orchestrators ON sandbox_resets TO PUBLIC
    USING (sandbox_orchestrator_may_access(owner, current_user))
    WITH CHECK (sandbox_orchestrator_may_access(owner, current_user));

-- Asks for checkpoint p_name of sandbox p_id (replacing one of that name);
-- returns the request number. Raises when the name is not valid or
-- reserved, the sandbox is not one this role sees, or it has the most
-- checkpoints it may.
CREATE FUNCTION sandbox_checkpoint(p_id text, p_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    d record;
    req bigint;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z0-9][a-z0-9_-]{0,30}$' THEN
        RAISE EXCEPTION 'checkpoint name % is not valid: use 1 to 31 characters from a-z, 0-9, "_" and "-", starting with a letter or digit',
            coalesce(sandbox_quote(p_name), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name = 'baseline' THEN
        RAISE EXCEPTION 'checkpoint name baseline is reserved (the empty database sandboxd records after provisioning; sandbox_reset(id) goes back to it): choose another name'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT s.owner, s.incarnation INTO d FROM sandbox_desired s WHERE s.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no sandbox % that this role may see: request it first (sandbox_request)', coalesce(sandbox_quote(p_id), 'NULL')
            USING ERRCODE = 'no_data_found';
    END IF;
    -- A checkpoint is a use of the sandbox (a paused one resumes for it).
    UPDATE sandbox_desired SET last_used_at = now() WHERE id = p_id;
    req := nextval('sandbox_checkpoint_requests');
    INSERT INTO sandbox_checkpoints AS c (sandbox_id, name, owner, incarnation, request)
    VALUES (p_id, p_name, d.owner, d.incarnation, req)
    ON CONFLICT (sandbox_id, name) DO UPDATE
        SET owner = EXCLUDED.owner, incarnation = EXCLUDED.incarnation, request = EXCLUDED.request,
            state = 'requested', message = '', size_bytes = NULL, instances = '{}'::jsonb,
            requested_at = now(), done_at = NULL;
    PERFORM pg_notify('sandbox_desired', p_id);
    RETURN req;
END
$$;

-- Asks for sandbox p_id's data to go back to checkpoint p_name (NULL or
-- 'baseline': the baseline); returns the request number. Raises when the
-- sandbox is not one this role sees or has no such checkpoint.
CREATE FUNCTION sandbox_reset(p_id text, p_name text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    d record;
    target text := coalesce(p_name, 'baseline');
    req bigint;
BEGIN
    SELECT s.owner, s.incarnation INTO d FROM sandbox_desired s WHERE s.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no sandbox % that this role may see: request it first (sandbox_request)', coalesce(sandbox_quote(p_id), 'NULL')
            USING ERRCODE = 'no_data_found';
    END IF;
    IF target <> 'baseline' AND NOT EXISTS (
        SELECT 1 FROM sandbox_checkpoints c
        WHERE c.sandbox_id = p_id AND c.name = target AND c.state <> 'failed'
          AND c.incarnation IS NOT DISTINCT FROM d.incarnation)
    THEN
        RAISE EXCEPTION 'sandbox % has no checkpoint %: take it first (sandbox_checkpoint), or reset to the baseline (sandbox_reset(id)); its checkpoints: %',
            sandbox_quote(p_id), coalesce(sandbox_quote(p_name), 'NULL'),
            coalesce((SELECT string_agg(c.name, ', ' ORDER BY c.name) FROM sandbox_checkpoints c
                      WHERE c.sandbox_id = p_id AND c.state <> 'failed'), 'none')
            USING ERRCODE = 'no_data_found';
    END IF;
    -- A reset is a use of the sandbox (a paused one resumes for it).
    UPDATE sandbox_desired SET last_used_at = now() WHERE id = p_id;
    req := nextval('sandbox_checkpoint_requests');
    INSERT INTO sandbox_resets (request, sandbox_id, checkpoint, owner, incarnation)
    VALUES (req, p_id, target, d.owner, d.incarnation);
    PERFORM pg_notify('sandbox_desired', p_id);
    RETURN req;
END
$$;

-- Orchestrators get the checkpoint tables, the sequence and the verbs
-- through sandbox_orchestrator_privileges (migration 14), which
-- sandbox_grant_orchestrator and sandbox_revoke_orchestrator apply.

REVOKE ALL ON TABLE sandbox_checkpoints, sandbox_resets, sandbox_checkpoint_settings FROM PUBLIC;
REVOKE ALL ON SEQUENCE sandbox_checkpoint_requests FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION sandbox_checkpoint(text, text), sandbox_reset(text, text),
                           sandbox_checkpoints_validate(), sandbox_checkpoints_forget()
    FROM PUBLIC;

-- Orchestrators registered before this migration may use the verbs.
DO $$
DECLARE
    role_name name;
BEGIN
    FOR role_name IN
        SELECT o.role FROM sandbox_orchestrators o
        WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role)
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON TABLE sandbox_checkpoints, sandbox_resets TO %I', role_name);
        EXECUTE format('GRANT USAGE ON SEQUENCE sandbox_checkpoint_requests TO %I', role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION sandbox_checkpoint(text, text), sandbox_reset(text, text) TO %I', role_name);
    END LOOP;
END
$$;

DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'sandbox_checkpoints_validate()', 'sandbox_checkpoints_forget()', 'sandbox_checkpoint(text, text)', 'sandbox_reset(text, text)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;
