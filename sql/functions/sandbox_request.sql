-- The additive verb: inserts the row if absent (owner: p_owner, else the
-- calling role), otherwise adds to what it asks: services and attach are
-- the row's, then the new ones appended; features are the per-engine
-- union; seeds are the row's with the given engines' replaced; idle_timeout, owner_container, idle_action and isolation are
-- replaced only when given (a new row's idle_action is 'release', its
-- isolation NULL: the controller's --runtime); persistent and owner,
-- when given, must equal the row's. Never removes anything and leaves
-- expires_at alone (an expired row, unless persistent, is refused: set a
-- later expires_at, or release it first). Every call sets requested_at and
-- last_used_at and so bumps `generation`, which it returns: the generation
-- to wait for. SECURITY INVOKER: row-level security applies.
CREATE OR REPLACE FUNCTION sandbox_request(
    p_id text,
    p_owner text,
    p_services text[],
    p_features jsonb DEFAULT '{}',
    p_idle_timeout interval DEFAULT NULL,
    p_persistent boolean DEFAULT NULL,
    p_owner_container text DEFAULT NULL,
    p_attach text[] DEFAULT NULL,
    p_idle_action text DEFAULT NULL,
    p_isolation text DEFAULT NULL,
    p_seeds jsonb DEFAULT NULL
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

    IF p_seeds IS NOT NULL AND jsonb_typeof(p_seeds) <> 'object' THEN
        RAISE EXCEPTION 'seeds requested for sandbox % must be a JSON object mapping engine to a seed hash, e.g. {"postgres":"sha256:…"} (sandbox_seed_put returns the hash)', p_id
            USING ERRCODE = 'check_violation';
    END IF;

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
                isolation       = coalesce(p_isolation, cur.isolation),
                seeds           = cur.seeds || coalesce(p_seeds, '{}'),
                requested_at    = greatest(clock_timestamp(),
                                           cur.requested_at + interval '1 microsecond'),
                last_used_at    = now()
            WHERE d.id = p_id
            RETURNING d.generation INTO v_generation;
            RETURN v_generation;
        END IF;

        INSERT INTO sandbox_desired AS d
            (id, owner, services, features, attach, idle_timeout, persistent, owner_container,
             requested_at, idle_action, isolation, seeds)
        VALUES (p_id, coalesce(p_owner, current_user),
                sandbox_array_union('{}', p_services),
                sandbox_features_union('{}', p_features),
                sandbox_array_union('{}', p_attach),
                p_idle_timeout, coalesce(p_persistent, false), p_owner_container, clock_timestamp(),
                coalesce(p_idle_action, 'release'), p_isolation, coalesce(p_seeds, '{}'))
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
