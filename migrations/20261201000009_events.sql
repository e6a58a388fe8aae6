-- sandboxd: what it did to each sandbox, as events (like Kubernetes
-- Events): provisioned, claimed from the warm pool, healed (with the
-- cause), rotated, reaped (with the reason), failed (with the message),
-- heals held back.
--
-- * Written only by the leading sandboxd, through sandbox_record_events
--   below, which checks the writer's lease term (the fencing token of
--   migration 06), so a deposed leader's late events never land.
-- * Never a credential: the function replaces every password that the
--   sandbox's status holds with *** before it stores a message (the
--   controller scrubs the passwords it knows, old ones included, first).
-- * Bounded: an event equal to the sandbox's latest one (same incarnation,
--   reason, engine, detail and message) bumps its count and last_at
--   instead of adding a row; each sandbox keeps its newest p_keep rows;
--   sandboxd deletes events older than --event-retention at its relists.
-- * Orchestrators read the events of the rows they may read: events carry
--   the row's owner at the time, so an own-rows-only orchestrator still
--   sees the events of a sandbox it released (until they age out).
--
-- Unqualified names resolve to the tables' schema; the DO block at the end
-- pins the functions' search_path.

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

-- Records p_events (a JSON array of {"reason","engine","detail","message"})
-- for sandbox p_sandbox as the leader of p_term, then keeps only the
-- sandbox's newest p_keep events. Refused (SQLSTATE SX001) when p_term is
-- not the current, unexpired lease's.
CREATE FUNCTION sandbox_record_events(p_term bigint, p_sandbox text, p_incarnation uuid,
                                      p_owner text, p_events jsonb, p_keep integer)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ev      jsonb;
    msg     text;
    secret  text;
    latest  sandbox_events%ROWTYPE;
    cutoff  bigint;
BEGIN
    IF p_term IS NULL OR NOT sandbox_lease_valid(p_term) THEN
        RAISE EXCEPTION 'sandbox_events write refused: leader term % is not the current leader''s',
                        coalesce(p_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
    IF p_keep IS NULL OR p_keep < 1 THEN
        RAISE EXCEPTION 'sandbox_record_events: keep at least one event per sandbox (got %)', p_keep
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_events) <> 'array' THEN
        RAISE EXCEPTION 'sandbox_record_events: events must be a JSON array'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR ev IN SELECT value FROM jsonb_array_elements(p_events) LOOP
        msg := coalesce(ev->>'message', '');
        FOR secret IN
            SELECT e.value->>'password' FROM sandbox_status s, jsonb_each(s.services) e
             WHERE s.id = p_sandbox AND jsonb_typeof(e.value) = 'object'
               AND length(e.value->>'password') > 0
        LOOP
            msg := replace(msg, secret, '***');
        END LOOP;
        msg := left(msg, 1000);
        SELECT * INTO latest FROM sandbox_events
         WHERE sandbox_id = p_sandbox ORDER BY seq DESC LIMIT 1;
        IF FOUND
           AND latest.incarnation IS NOT DISTINCT FROM p_incarnation
           AND latest.reason = ev->>'reason'
           AND latest.engine IS NOT DISTINCT FROM ev->>'engine'
           AND latest.detail IS NOT DISTINCT FROM ev->>'detail'
           AND latest.message = msg THEN
            UPDATE sandbox_events
               SET count = least(count, 2147483646) + 1, last_at = now(), leader_term = p_term,
                   owner = coalesce(p_owner, '')
             WHERE seq = latest.seq;
        ELSE
            INSERT INTO sandbox_events (sandbox_id, incarnation, owner, reason, engine, detail,
                                        message, leader_term)
            VALUES (p_sandbox, p_incarnation, coalesce(p_owner, ''), ev->>'reason', ev->>'engine',
                    left(ev->>'detail', 64), msg, p_term);
        END IF;
    END LOOP;
    SELECT seq INTO cutoff FROM sandbox_events
     WHERE sandbox_id = p_sandbox ORDER BY seq DESC OFFSET p_keep - 1 LIMIT 1;
    IF cutoff IS NOT NULL THEN
        DELETE FROM sandbox_events WHERE sandbox_id = p_sandbox AND seq < cutoff;
    END IF;
END
$$;

-- The owner (sandboxd) is not subject to the policy (no FORCE); an
-- orchestrator sees the events whose owner it may access.
ALTER TABLE sandbox_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY sandbox_events_orchestrators ON sandbox_events FOR SELECT TO PUBLIC
    USING (sandbox_orchestrator_may_access(owner, current_user));

REVOKE ALL ON TABLE sandbox_events FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer) FROM PUBLIC;

-- As in migration 03, plus SELECT on sandbox_events.
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
    EXECUTE format('GRANT SELECT ON TABLE sandbox_status, sandbox_events, sandbox_engines, sandbox_engine_features TO %I', role_name);
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

-- As in migration 03, plus sandbox_events and sandbox_record_events.
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
        EXECUTE format('REVOKE ALL ON TABLE sandbox_desired, sandbox_status, sandbox_events, sandbox_engines, '
                       'sandbox_engine_features, sandbox_orchestrators FROM %I', role_name);
        EXECUTE format('REVOKE ALL ON FUNCTION sandbox_allowed_engines(), sandbox_allowed_features(text), '
                       'sandbox_quote(text), sandbox_orchestrator_may_access(text, name), '
                       'sandbox_orchestrator_may_see_status(text, name), sandbox_desired_validate(), '
                       'sandbox_desired_validate_lifecycle(), '
                       'sandbox_notify(), sandbox_grant_orchestrator(name, boolean), '
                       'sandbox_revoke_orchestrator(name), '
                       'sandbox_array_union(text[], text[]), sandbox_features_union(jsonb, jsonb), '
                       'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[]), '
                       'sandbox_touch(text), sandbox_release(text), '
                       'sandbox_record_events(bigint, text, uuid, text, jsonb, integer) FROM %I', role_name);
        IF pg_has_role((SELECT nspowner FROM pg_namespace WHERE nspname = schema_name), 'USAGE') THEN
            EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM %I', schema_name, role_name);
        END IF;
    END IF;
    RETURN registered;
END
$$;

REVOKE EXECUTE ON FUNCTION sandbox_grant_orchestrator(name, boolean),
                           sandbox_revoke_orchestrator(name)
    FROM PUBLIC;

-- Orchestrators registered before this migration may read the events.
DO $$
DECLARE
    role_name name;
BEGIN
    FOR role_name IN
        SELECT o.role FROM sandbox_orchestrators o
        WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role)
    LOOP
        EXECUTE format('GRANT SELECT ON TABLE sandbox_events TO %I', role_name);
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
        'sandbox_record_events(bigint, text, uuid, text, jsonb, integer)',
        'sandbox_grant_orchestrator(name, boolean)', 'sandbox_revoke_orchestrator(name)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;
