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

    -- seeds: {"engine": "sha256:…"}, each engine requested, each hash one
    -- this row's owner registered for that engine (sandbox_seed_put).
    IF NEW.seeds IS NULL THEN
        NEW.seeds := '{}'::jsonb;
    END IF;
    IF jsonb_typeof(NEW.seeds) <> 'object' THEN
        RAISE EXCEPTION 'seeds of sandbox % must be a JSON object mapping engine to a seed hash, e.g. {"postgres":"sha256:…"} (sandbox_seed_put returns the hash)', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF (SELECT count(*) FROM jsonb_object_keys(NEW.seeds)) > n_engines THEN
        RAISE EXCEPTION 'seeds of sandbox % name more engines than there are (%): allowed engines are %',
            NEW.id, n_engines, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.persistent AND NEW.seeds <> '{}'::jsonb THEN
        RAISE EXCEPTION 'sandbox % is persistent, and seeds are for throwaway sandboxes: a persistent sandbox keeps its data across heals, so load it once from the agent''s side (or request it without persistent)', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.fork_of IS NOT NULL
       AND (NEW.services, NEW.features) IS DISTINCT FROM (OLD.services, OLD.features) THEN
        RAISE EXCEPTION 'sandbox % is a fork of %, and its services and features are its source''s at the fork (its data was copied for them): fork a sandbox that has the ones you need, or request a new sandbox',
            NEW.id, sandbox_quote(NEW.fork_of)
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.fork_of IS NOT NULL AND NEW.seeds <> '{}'::jsonb THEN
        RAISE EXCEPTION 'sandbox % is a fork of %, and a fork starts with its source''s data, not a seed: fork a seeded sandbox, or request a new one with the seed',
            NEW.id, sandbox_quote(NEW.fork_of)
            USING ERRCODE = 'check_violation';
    END IF;
    FOR eng, val IN SELECT key, value FROM jsonb_each(NEW.seeds) LOOP
        IF NOT (eng = ANY (NEW.services)) THEN
            RAISE EXCEPTION 'seeds of sandbox % name engine %, which its services (%) do not request: add it to services or drop its seed',
                NEW.id, sandbox_quote(eng), array_to_string(NEW.services, ',')
                USING ERRCODE = 'check_violation';
        END IF;
        IF jsonb_typeof(val) <> 'string' OR (val #>> '{}') !~ '^sha256:[0-9a-f]{64}$' THEN
            RAISE EXCEPTION 'seed of sandbox % for engine % must be a hash ''sha256:'' and 64 hex digits, as sandbox_seed_put returns it, got %',
                NEW.id, sandbox_quote(eng), left(val::text, 80)
                USING ERRCODE = 'check_violation';
        END IF;
        IF sandbox_seed_engine(NEW.owner, val #>> '{}') IS DISTINCT FROM eng THEN
            RAISE EXCEPTION 'seed % of sandbox % for engine % is not one owner % registered for that engine: register it first with sandbox_seed_put(%, content)',
                val #>> '{}', NEW.id, sandbox_quote(eng), sandbox_quote(NEW.owner), quote_literal(eng)
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;

    -- isolation: NULL (the controller's --runtime) or a known level.
    IF NEW.isolation IS NOT NULL AND NEW.isolation NOT IN ('container', 'gvisor') THEN
        RAISE EXCEPTION 'isolation of sandbox % is %: use ''container'' (Docker''s default runtime), ''gvisor'' (gVisor''s user-space kernel, runsc) or NULL (the controller''s --runtime)',
            NEW.id, sandbox_quote(NEW.isolation)
            USING ERRCODE = 'check_violation';
    END IF;

    IF TG_OP = 'INSERT' THEN
        NEW.generation := 1;
        NEW.created_at := now();
        NEW.updated_at := now();
    ELSE
        NEW.created_at := OLD.created_at;
        IF (NEW.owner, NEW.services, NEW.features, NEW.expires_at, NEW.attach, NEW.isolation, NEW.seeds)
           IS DISTINCT FROM (OLD.owner, OLD.services, OLD.features, OLD.expires_at, OLD.attach, OLD.isolation, OLD.seeds) THEN
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
