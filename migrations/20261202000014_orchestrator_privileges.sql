-- sandboxd: what an orchestrator may use, as one list.
--
-- * sandbox_orchestrator_privileges holds every privilege that
--   sandbox_grant_orchestrator gives a role (object_kind, object,
--   privilege), and, with privilege NULL, the objects an orchestrator never
--   gets, whose privileges sandbox_revoke_orchestrator still removes (in
--   case they were granted by hand). Only the tables' owner writes it;
--   orchestrators may not even read it.
-- * sandbox_grant_orchestrator and sandbox_revoke_orchestrator are replaced
--   one last time: they apply and remove that list (same argument checks,
--   messages and SQLSTATEs as migration 09's).
--
-- A LATER MIGRATION THAT GIVES ORCHESTRATORS A NEW OBJECT (or takes one
-- away) does not replace these functions. It only
--   INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege)
--       VALUES ('function', 'sandbox_new_verb(text)', 'EXECUTE');
--   SELECT sandbox_apply_orchestrator_privileges(o.role) FROM sandbox_orchestrators o
--    WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role);
-- (the SELECT gives the new rows to the orchestrators registered already),
-- lists its internal functions and tables with privilege NULL, and, when it
-- drops or renames a listed object, deletes or updates its rows in the same
-- migration. Objects are written as GRANT takes them: a table or sequence
-- name, a function's name with its argument types, a schema name; a trigger
-- normalises and checks them.
--
-- Unqualified names resolve to the tables' schema; the DO block at the end
-- pins the functions' search_path.

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

COMMENT ON TABLE sandbox_orchestrator_privileges IS
    'What sandbox_grant_orchestrator grants (privilege NULL: never granted, always revoked); migrations INSERT here instead of replacing the grant functions';

-- Every row names an object that exists, of its kind, in the form GRANT
-- takes and pg_catalog prints (so one object is one name).
CREATE FUNCTION sandbox_orchestrator_privileges_validate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rel regclass;
    kind "char";
BEGIN
    IF NEW.object_kind = 'function' THEN
        IF to_regprocedure(NEW.object) IS NULL THEN
            RAISE EXCEPTION 'orchestrator privilege on function %: there is no such function; write its name with its argument types, e.g. sandbox_touch(text)',
                sandbox_quote(NEW.object)
                USING ERRCODE = 'undefined_function';
        END IF;
        NEW.object := to_regprocedure(NEW.object)::text;
    ELSIF NEW.object_kind = 'schema' THEN
        IF to_regnamespace(NEW.object) IS NULL THEN
            RAISE EXCEPTION 'orchestrator privilege on schema %: there is no such schema', sandbox_quote(NEW.object)
                USING ERRCODE = 'invalid_schema_name';
        END IF;
        NEW.object := to_regnamespace(NEW.object)::text;
    ELSE
        rel := to_regclass(NEW.object);
        SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = rel;
        IF rel IS NULL OR (NEW.object_kind = 'sequence') <> (kind = 'S')
           OR kind NOT IN ('r', 'p', 'v', 'S') THEN
            RAISE EXCEPTION 'orchestrator privilege on % %: there is no such %', NEW.object_kind,
                sandbox_quote(NEW.object), NEW.object_kind
                USING ERRCODE = 'undefined_table';
        END IF;
        NEW.object := rel::text;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_orchestrator_privileges_validate
    BEFORE INSERT OR UPDATE ON sandbox_orchestrator_privileges
    FOR EACH ROW EXECUTE FUNCTION sandbox_orchestrator_privileges_validate();

-- Grants role_name every privilege of the list (adds; takes nothing away).
-- For sandbox_grant_orchestrator and for migrations that add rows.
CREATE FUNCTION sandbox_apply_orchestrator_privileges(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    FOR p IN
        SELECT o.object_kind, o.object,
               string_agg(o.privilege, ', ' ORDER BY o.privilege) AS privileges
        FROM sandbox_orchestrator_privileges o
        WHERE o.privilege IS NOT NULL
        GROUP BY o.object_kind, o.object
        ORDER BY o.object_kind, o.object
    LOOP
        -- The casts quote the names (and fail loudly if one is gone); the
        -- privileges are from the CHECK's fixed set.
        EXECUTE format('GRANT %s ON %s %s TO %I', p.privileges, upper(p.object_kind),
                       CASE p.object_kind
                           WHEN 'function' THEN p.object::regprocedure::text
                           WHEN 'schema' THEN p.object::regnamespace::text
                           ELSE p.object::regclass::text
                       END,
                       role_name);
    END LOOP;
END
$$;

-- Grants `role_name` exactly the privileges of sandbox_orchestrator_privileges,
-- revoking whatever else it had on the listed objects, and registers it for
-- the row-level security policies; with own_rows_only it sees and writes
-- only rows whose owner is its role name. Only the owner of the tables (the
-- controller) may call it.
CREATE OR REPLACE FUNCTION sandbox_grant_orchestrator(role_name name, own_rows_only boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
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
    PERFORM sandbox_apply_orchestrator_privileges(role_name);
    INSERT INTO sandbox_orchestrators (role, own_rows_only)
    VALUES (role_name, own_rows_only);
END
$$;

-- Unregisters `role_name` and revokes all its privileges on every listed
-- object (a listed object that no longer exists is skipped); the schema's
-- USAGE only when this role may (it owns the schema or is a member of its
-- owner). Returns whether the role was registered.
CREATE OR REPLACE FUNCTION sandbox_revoke_orchestrator(role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    registered boolean;
    p record;
BEGIN
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'sandbox_revoke_orchestrator needs a role name'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    DELETE FROM sandbox_orchestrators o WHERE o.role = role_name;
    registered := FOUND;
    IF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
        FOR p IN
            SELECT DISTINCT o.object_kind, o.object,
                   CASE o.object_kind
                       WHEN 'function' THEN to_regprocedure(o.object)::text
                       WHEN 'schema' THEN to_regnamespace(o.object)::text
                       ELSE to_regclass(o.object)::text
                   END AS target
            FROM sandbox_orchestrator_privileges o
            ORDER BY o.object_kind, o.object
        LOOP
            CONTINUE WHEN p.target IS NULL;
            IF p.object_kind = 'schema' THEN
                IF pg_has_role((SELECT nspowner FROM pg_namespace WHERE oid = to_regnamespace(p.object)), 'USAGE') THEN
                    EXECUTE format('REVOKE USAGE ON SCHEMA %s FROM %I', p.target, role_name);
                END IF;
            ELSE
                EXECUTE format('REVOKE ALL ON %s %s FROM %I', upper(p.object_kind), p.target, role_name);
            END IF;
        END LOOP;
    END IF;
    RETURN registered;
END
$$;

REVOKE ALL ON TABLE sandbox_orchestrator_privileges FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION sandbox_orchestrator_privileges_validate(),
                           sandbox_apply_orchestrator_privileges(name),
                           sandbox_grant_orchestrator(name, boolean),
                           sandbox_revoke_orchestrator(name)
    FROM PUBLIC;

-- Pin the search_path of the new and replaced functions (CREATE OR
-- REPLACE drops their settings), pg_temp last.
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'sandbox_orchestrator_privileges_validate()', 'sandbox_apply_orchestrator_privileges(name)',
        'sandbox_grant_orchestrator(name, boolean)', 'sandbox_revoke_orchestrator(name)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;

-- Everything an orchestrator got from migrations 02 to 13 (the grant
-- function of 13), and what their revoke functions took away.
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege)
    VALUES ('schema', schema_name, 'USAGE');
END
$$;

INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege) VALUES
    ('table', 'sandbox_desired', 'SELECT'),
    ('table', 'sandbox_desired', 'INSERT'),
    ('table', 'sandbox_desired', 'UPDATE'),
    ('table', 'sandbox_desired', 'DELETE'),
    ('table', 'sandbox_status', 'SELECT'),
    ('table', 'sandbox_events', 'SELECT'),
    ('table', 'sandbox_engines', 'SELECT'),
    ('table', 'sandbox_engine_features', 'SELECT'),
    ('function', 'sandbox_allowed_engines()', 'EXECUTE'),
    ('function', 'sandbox_allowed_features(text)', 'EXECUTE'),
    ('function', 'sandbox_quote(text)', 'EXECUTE'),
    ('function', 'sandbox_orchestrator_may_access(text, name)', 'EXECUTE'),
    ('function', 'sandbox_orchestrator_may_see_status(text, name)', 'EXECUTE'),
    ('function', 'sandbox_array_union(text[], text[])', 'EXECUTE'),
    ('function', 'sandbox_features_union(jsonb, jsonb)', 'EXECUTE'),
    ('function', 'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[], text)', 'EXECUTE'),
    ('function', 'sandbox_touch(text)', 'EXECUTE'),
    ('function', 'sandbox_release(text)', 'EXECUTE'),
    -- Checkpoints (migration 12): the verbs, what they write, the numbers.
    ('table', 'sandbox_checkpoints', 'SELECT'),
    ('table', 'sandbox_checkpoints', 'INSERT'),
    ('table', 'sandbox_checkpoints', 'UPDATE'),
    ('table', 'sandbox_resets', 'SELECT'),
    ('table', 'sandbox_resets', 'INSERT'),
    ('table', 'sandbox_resets', 'UPDATE'),
    ('sequence', 'sandbox_checkpoint_requests', 'USAGE'),
    ('function', 'sandbox_checkpoint(text, text)', 'EXECUTE'),
    ('function', 'sandbox_reset(text, text)', 'EXECUTE'),
    -- Never granted; revoked in case someone granted them by hand.
    ('table', 'sandbox_orchestrators', NULL),
    ('table', 'sandbox_checkpoint_settings', NULL),
    ('table', 'sandbox_orchestrator_privileges', NULL),
    ('function', 'sandbox_desired_validate()', NULL),
    ('function', 'sandbox_desired_validate_lifecycle()', NULL),
    ('function', 'sandbox_desired_validate_idle_action()', NULL),
    ('function', 'sandbox_notify()', NULL),
    ('function', 'sandbox_grant_orchestrator(name, boolean)', NULL),
    ('function', 'sandbox_revoke_orchestrator(name)', NULL),
    ('function', 'sandbox_record_events(bigint, text, uuid, text, jsonb, integer)', NULL),
    ('function', 'sandbox_checkpoints_validate()', NULL),
    ('function', 'sandbox_checkpoints_forget()', NULL),
    ('function', 'sandbox_apply_orchestrator_privileges(name)', NULL),
    ('function', 'sandbox_orchestrator_privileges_validate()', NULL);

-- The orchestrators registered already hold the list (it is what they were
-- granted; applying it again changes nothing but makes sure).
SELECT sandbox_apply_orchestrator_privileges(o.role) FROM sandbox_orchestrators o
WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role);
