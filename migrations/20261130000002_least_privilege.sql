-- sandboxd: least privilege in the state database.
--
-- * The controller runs as an ordinary (non-superuser) role that owns these
--   tables; it runs the migrations and bypasses row-level security as owner.
-- * Orchestrators are other roles, registered by the owner with
--   sandbox_grant_orchestrator(role, own_rows_only): they may write
--   sandbox_desired and read sandbox_status and the allowlist, nothing else;
--   registered with own_rows_only they see and write only rows whose
--   `owner` is their role name.
-- * The validation trigger refuses the hostile shapes the first migration
--   let through (multi-dimensional or offset arrays, infinite times, huge
--   feature arrays, control characters), checks the new `attach` column, and
--   every function runs with a pinned search_path, so that a session's
--   temporary table cannot shadow the allowlist.
--
-- Unqualified names below resolve to the schema the first migration created
-- the tables in (normally public); the DO block at the end pins every
-- function's search_path to `pg_catalog, <that schema>, pg_temp`.

-- Containers (the orchestrator's agents) sandboxd connects to the sandbox's
-- Docker network; checked by the trigger below.
ALTER TABLE sandbox_desired ADD COLUMN attach text[] NOT NULL DEFAULT '{}';

-- The Docker network the sandbox's engines are reachable on (sandboxd writes it).
ALTER TABLE sandbox_status ADD COLUMN network text NULL;

-- An insert that names no owner is owned by the role that inserts it, which
-- is what own-rows-only orchestrators need. '' stays allowed (rows written
-- before this migration have it) except for own-rows-only orchestrators,
-- whose rows must carry their own role name.
ALTER TABLE sandbox_desired ALTER COLUMN owner SET DEFAULT current_user;

-- A value quoted for an error message: quote_literal, unless it holds
-- control characters (an ANSI escape sequence, a newline), which are then
-- shown JSON-escaped so that no message carries them raw.
CREATE FUNCTION sandbox_quote(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN value IS NULL THEN 'NULL'
        WHEN left(value, 80) ~ '[[:cntrl:]]' THEN to_json(left(value, 80))::text
        ELSE quote_literal(left(value, 80))
    END
$$;

-- Rejects invalid desired rows with a message that names what is allowed,
-- and owns `generation` and `updated_at`. Every size is checked before any
-- per-element work, so an oversized value is refused at once.
CREATE OR REPLACE FUNCTION sandbox_desired_validate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- At most this many features per engine (no engine allows more).
    max_features CONSTANT integer := 16;
    -- At most this many containers to attach.
    max_attach   CONSTANT integer := 16;
    n_engines integer;
    svc       text;
    eng       text;
    val       jsonb;
    feat      jsonb;
    container text;
BEGIN
    IF NEW.id IS NULL OR NEW.id !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid sandbox id %: use 1 to 63 characters from a-z, 0-9, "-" and "_", starting with a letter or digit',
            sandbox_quote(NEW.id)
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.owner IS NULL OR length(NEW.owner) > 200 OR NEW.owner ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid owner for sandbox %: owner must be text of at most 200 characters without control characters (no newlines or escape sequences)', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- services: a plain list of distinct known engines.
    IF NEW.services IS NULL OR cardinality(NEW.services) = 0 THEN
        RAISE EXCEPTION 'sandbox % requests no services: services must name at least one of: %',
            NEW.id, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    n_engines := (SELECT count(*) FROM sandbox_engines);
    IF cardinality(NEW.services) > n_engines THEN
        RAISE EXCEPTION 'services of sandbox % list % entries, but there are only % engines: list each of % at most once',
            NEW.id, cardinality(NEW.services), n_engines, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    IF array_ndims(NEW.services) <> 1 OR array_lower(NEW.services, 1) <> 1 THEN
        RAISE EXCEPTION 'services of sandbox % must be a one-dimensional list starting at index 1, e.g. ''{postgres,redis}'', of: %',
            NEW.id, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    IF array_position(NEW.services, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'services of sandbox % contain NULL: list engine names, of: %',
            NEW.id, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    FOREACH svc IN ARRAY NEW.services LOOP
        IF NOT EXISTS (SELECT 1 FROM sandbox_engines WHERE engine = svc) THEN
            RAISE EXCEPTION 'unknown engine % in services of sandbox %: allowed engines are %',
                sandbox_quote(svc), NEW.id, sandbox_allowed_engines()
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    IF (SELECT count(*) FROM unnest(NEW.services)) <> (SELECT count(DISTINCT s) FROM unnest(NEW.services) s) THEN
        RAISE EXCEPTION 'services of sandbox % name an engine twice: list each engine once', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.expires_at IS NOT NULL AND NOT isfinite(NEW.expires_at) THEN
        RAISE EXCEPTION 'expires_at of sandbox % is %: use a finite time, or NULL for no expiry', NEW.id, NEW.expires_at
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.expires_at >= '10000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'expires_at of sandbox % is past the year 9999: use an earlier time, or NULL for no expiry', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- features: {"engine": ["feature", ...]}, each engine requested, each
    -- feature allowlisted, at most max_features of them, each once.
    IF NEW.features IS NULL THEN
        NEW.features := '{}'::jsonb;
    END IF;
    IF jsonb_typeof(NEW.features) <> 'object' THEN
        RAISE EXCEPTION 'features of sandbox % must be a JSON object mapping engine to an array of feature names, e.g. {"postgres":["pg_trgm"],"redis":["search"]}', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    FOR eng, val IN SELECT key, value FROM jsonb_each(NEW.features) LOOP
        IF NOT EXISTS (SELECT 1 FROM sandbox_engines WHERE engine = eng) THEN
            RAISE EXCEPTION 'features of sandbox % name unknown engine %: allowed engines are %',
                NEW.id, sandbox_quote(eng), sandbox_allowed_engines()
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT (eng = ANY (NEW.services)) THEN
            RAISE EXCEPTION 'features of sandbox % name engine %, which its services (%) do not request: add it to services or drop its features',
                NEW.id, quote_literal(eng), array_to_string(NEW.services, ', ')
                USING ERRCODE = 'check_violation';
        END IF;
        IF jsonb_typeof(val) <> 'array' THEN
            RAISE EXCEPTION 'features of sandbox % for engine % must be a JSON array of feature names, e.g. {"%":["%"]}; allowed features are %',
                NEW.id, quote_literal(eng), eng,
                coalesce((SELECT min(feature) FROM sandbox_engine_features WHERE engine = eng), '...'),
                sandbox_allowed_features(eng)
                USING ERRCODE = 'check_violation';
        END IF;
        IF jsonb_array_length(val) > max_features THEN
            RAISE EXCEPTION 'features of sandbox % for engine % list % entries: at most % features per engine are allowed, each once, of: %',
                NEW.id, quote_literal(eng), jsonb_array_length(val), max_features, sandbox_allowed_features(eng)
                USING ERRCODE = 'check_violation';
        END IF;
        FOR feat IN SELECT value FROM jsonb_array_elements(val) LOOP
            IF jsonb_typeof(feat) <> 'string' THEN
                RAISE EXCEPTION 'features of sandbox % for engine % must be strings, got %: allowed features are %',
                    NEW.id, quote_literal(eng), left(feat::text, 80), sandbox_allowed_features(eng)
                    USING ERRCODE = 'check_violation';
            END IF;
            IF NOT EXISTS (SELECT 1 FROM sandbox_engine_features
                           WHERE engine = eng AND feature = feat #>> '{}') THEN
                RAISE EXCEPTION 'feature % is not allowed for engine % in sandbox %: allowed features are %',
                    sandbox_quote(feat #>> '{}'), quote_literal(eng), NEW.id, sandbox_allowed_features(eng)
                    USING ERRCODE = 'check_violation';
            END IF;
        END LOOP;
        IF (SELECT count(DISTINCT value) FROM jsonb_array_elements(val)) <> jsonb_array_length(val) THEN
            RAISE EXCEPTION 'features of sandbox % for engine % name a feature twice: list each feature once',
                NEW.id, quote_literal(eng)
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;

    -- attach: Docker container names, each once, at most max_attach.
    IF NEW.attach IS NULL THEN
        NEW.attach := '{}';
    END IF;
    IF cardinality(NEW.attach) > max_attach THEN
        RAISE EXCEPTION 'attach of sandbox % lists % containers: at most % are allowed', NEW.id, cardinality(NEW.attach), max_attach
            USING ERRCODE = 'check_violation';
    END IF;
    IF cardinality(NEW.attach) > 0 THEN
        IF array_ndims(NEW.attach) <> 1 OR array_lower(NEW.attach, 1) <> 1 THEN
            RAISE EXCEPTION 'attach of sandbox % must be a one-dimensional list of container names starting at index 1, e.g. ''{agent-7}''', NEW.id
                USING ERRCODE = 'check_violation';
        END IF;
        FOREACH container IN ARRAY NEW.attach LOOP
            IF container IS NULL OR container !~ '^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$' THEN
                RAISE EXCEPTION 'invalid container name % in attach of sandbox %: use a Docker container name, 1 to 128 characters from a-z, A-Z, 0-9, "_", "." and "-", starting with a letter or digit',
                    sandbox_quote(container), NEW.id
                    USING ERRCODE = 'check_violation';
            END IF;
        END LOOP;
        IF (SELECT count(DISTINCT a) FROM unnest(NEW.attach) a) <> cardinality(NEW.attach) THEN
            RAISE EXCEPTION 'attach of sandbox % names a container twice: list each container once', NEW.id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF TG_OP = 'INSERT' THEN
        NEW.generation := 1;
        NEW.created_at := now();
        NEW.updated_at := now();
    ELSE
        NEW.created_at := OLD.created_at;
        IF (NEW.owner, NEW.services, NEW.features, NEW.expires_at, NEW.attach)
           IS DISTINCT FROM (OLD.owner, OLD.services, OLD.features, OLD.expires_at, OLD.attach) THEN
            NEW.generation := OLD.generation + 1;
            NEW.updated_at := now();
        ELSE
            NEW.generation := OLD.generation;
            NEW.updated_at := OLD.updated_at;
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- Orchestrator roles registered by sandbox_grant_orchestrator. Roles are
-- cluster-wide and the controller's role cannot create them, so registration
-- is by name; only the owner (the controller) reads or writes this table.
CREATE TABLE sandbox_orchestrators (
    role          name PRIMARY KEY,
    own_rows_only boolean NOT NULL DEFAULT false
);

-- The row-level security predicates. SECURITY DEFINER so that they read
-- sandbox_orchestrators (and, for statuses, the desired row's owner) as the
-- owner; the policies pass `current_user`, which inside a SECURITY DEFINER
-- function would be the owner.
CREATE FUNCTION sandbox_orchestrator_may_access(row_owner text, role_name name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = role_name
          AND (NOT o.own_rows_only OR row_owner = o.role::text))
$$;

CREATE FUNCTION sandbox_orchestrator_may_see_status(sandbox_id text, role_name name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = role_name
          AND (NOT o.own_rows_only
               OR EXISTS (SELECT 1 FROM sandbox_desired d
                          WHERE d.id = sandbox_id AND d.owner = o.role::text)))
$$;

-- The owner (the controller) is not subject to these (no FORCE); every
-- other role sees only what the predicates allow, and nothing unless it is
-- registered.
ALTER TABLE sandbox_desired ENABLE ROW LEVEL SECURITY;
CREATE POLICY sandbox_desired_orchestrators ON sandbox_desired TO PUBLIC
    USING (sandbox_orchestrator_may_access(owner, current_user))
    WITH CHECK (sandbox_orchestrator_may_access(owner, current_user));

ALTER TABLE sandbox_status ENABLE ROW LEVEL SECURITY;
CREATE POLICY sandbox_status_orchestrators ON sandbox_status FOR SELECT TO PUBLIC
    USING (sandbox_orchestrator_may_see_status(id, current_user));

-- Grants `role_name` exactly what an orchestrator needs, revoking whatever
-- else it had on these objects, and registers it for the row-level security
-- policies; with own_rows_only it sees and writes only rows whose owner is
-- its role name. Only the owner of the tables (the controller) may call it.
CREATE FUNCTION sandbox_grant_orchestrator(role_name name, own_rows_only boolean DEFAULT false)
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
    -- What the validation trigger and the policies call as the orchestrator.
    EXECUTE format('GRANT EXECUTE ON FUNCTION sandbox_allowed_engines(), sandbox_allowed_features(text), '
                   'sandbox_quote(text), sandbox_orchestrator_may_access(text, name), '
                   'sandbox_orchestrator_may_see_status(text, name) TO %I', role_name);
    INSERT INTO sandbox_orchestrators (role, own_rows_only)
    VALUES (role_name, own_rows_only);
END
$$;

-- Revokes everything sandbox_grant_orchestrator granted and unregisters
-- the role; true if it was registered. A role that no longer exists is
-- only unregistered.
CREATE FUNCTION sandbox_revoke_orchestrator(role_name name) RETURNS boolean
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
                       'sandbox_notify(), sandbox_grant_orchestrator(name, boolean), '
                       'sandbox_revoke_orchestrator(name) FROM %I', role_name);
        -- Only when this role owns the schema: elsewhere (a public schema
        -- owned by a superuser) the grant was never made.
        IF pg_has_role((SELECT nspowner FROM pg_namespace WHERE nspname = schema_name), 'USAGE') THEN
            EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM %I', schema_name, role_name);
        END IF;
    END IF;
    RETURN registered;
END
$$;

-- Only what an orchestrator is granted by name may be executed by it;
-- granting and revoking is for the owner alone.
REVOKE EXECUTE ON FUNCTION sandbox_allowed_engines(), sandbox_allowed_features(text), sandbox_quote(text),
    sandbox_orchestrator_may_access(text, name), sandbox_orchestrator_may_see_status(text, name),
    sandbox_desired_validate(), sandbox_notify(),
    sandbox_grant_orchestrator(name, boolean), sandbox_revoke_orchestrator(name)
    FROM PUBLIC;

-- Pin every function's search_path to the tables' schema, pg_temp last
-- (unlisted, pg_temp would be searched first, and a session's temporary
-- table named sandbox_engine_features would shadow the allowlist).
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'sandbox_allowed_engines()', 'sandbox_allowed_features(text)', 'sandbox_quote(text)',
        'sandbox_desired_validate()', 'sandbox_notify()',
        'sandbox_orchestrator_may_access(text, name)', 'sandbox_orchestrator_may_see_status(text, name)',
        'sandbox_grant_orchestrator(name, boolean)', 'sandbox_revoke_orchestrator(name)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;
