-- sandboxd: the contract with orchestrators.
--
-- sandbox_desired is written by orchestrators; sandbox_status by sandboxd.
-- The allowlist tables are owned by sandboxd: `sandboxd migrate` (and every
-- controller start) rewrites them from the engine registry compiled into the
-- binary, so the database and the controller always agree on what is allowed.

CREATE TABLE sandbox_engines (
    engine text PRIMARY KEY
);

CREATE TABLE sandbox_engine_features (
    engine  text NOT NULL REFERENCES sandbox_engines (engine) ON DELETE CASCADE,
    feature text NOT NULL,
    PRIMARY KEY (engine, feature)
);

-- Seed with the registry as of this migration; the controller re-syncs at start.
INSERT INTO sandbox_engines (engine) VALUES ('postgres'), ('redis'), ('mongo');
INSERT INTO sandbox_engine_features (engine, feature) VALUES
    ('postgres', 'vector'), ('postgres', 'postgis'), ('postgres', 'pg_trgm'),
    ('postgres', 'citext'), ('postgres', 'uuid-ossp'),
    ('redis', 'search'), ('redis', 'json'), ('redis', 'bloom');

CREATE TABLE sandbox_desired (
    id          text PRIMARY KEY,
    owner       text NOT NULL DEFAULT '',
    services    text[] NOT NULL,
    features    jsonb NOT NULL DEFAULT '{}'::jsonb,
    expires_at  timestamptz NULL,
    generation  bigint NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sandbox_status (
    id                  text PRIMARY KEY,
    phase               text NOT NULL
        CHECK (phase IN ('pending', 'provisioning', 'ready', 'failed', 'terminating')),
    observed_generation bigint NOT NULL DEFAULT 0,
    message             text NOT NULL DEFAULT '',
    services            jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- Comma-separated, sorted list used in error messages.
CREATE FUNCTION sandbox_allowed_engines() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(engine, ', ' ORDER BY engine), '(none)') FROM sandbox_engines
$$;

CREATE FUNCTION sandbox_allowed_features(p_engine text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(feature, ', ' ORDER BY feature), '(none)')
    FROM sandbox_engine_features WHERE engine = p_engine
$$;

-- Rejects invalid desired rows with a message that names what is allowed,
-- and owns `generation` and `updated_at`.
CREATE FUNCTION sandbox_desired_validate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    svc      text;
    eng      text;
    val      jsonb;
    feat     jsonb;
BEGIN
    IF NEW.id IS NULL OR NEW.id !~ '^[a-z0-9][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid sandbox id %: use 1 to 63 characters from a-z, 0-9, "-" and "_", starting with a letter or digit',
            coalesce(quote_literal(left(NEW.id, 80)), 'NULL')
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.owner IS NULL OR length(NEW.owner) > 200 THEN
        RAISE EXCEPTION 'invalid owner for sandbox %: owner must be text of at most 200 characters', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.services IS NULL OR cardinality(NEW.services) = 0 THEN
        RAISE EXCEPTION 'sandbox % requests no services: services must name at least one of: %',
            NEW.id, sandbox_allowed_engines()
            USING ERRCODE = 'check_violation';
    END IF;
    FOREACH svc IN ARRAY NEW.services LOOP
        IF svc IS NULL OR NOT EXISTS (SELECT 1 FROM sandbox_engines WHERE engine = svc) THEN
            RAISE EXCEPTION 'unknown engine % in services of sandbox %: allowed engines are %',
                coalesce(quote_literal(svc), 'NULL'), NEW.id, sandbox_allowed_engines()
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    IF (SELECT count(*) FROM unnest(NEW.services)) <> (SELECT count(DISTINCT s) FROM unnest(NEW.services) s) THEN
        RAISE EXCEPTION 'services of sandbox % name an engine twice: list each engine once', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

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
                NEW.id, quote_literal(eng), sandbox_allowed_engines()
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
        FOR feat IN SELECT value FROM jsonb_array_elements(val) LOOP
            IF jsonb_typeof(feat) <> 'string' THEN
                RAISE EXCEPTION 'features of sandbox % for engine % must be strings, got %: allowed features are %',
                    NEW.id, quote_literal(eng), feat::text, sandbox_allowed_features(eng)
                    USING ERRCODE = 'check_violation';
            END IF;
            IF NOT EXISTS (SELECT 1 FROM sandbox_engine_features
                           WHERE engine = eng AND feature = feat #>> '{}') THEN
                RAISE EXCEPTION 'feature % is not allowed for engine % in sandbox %: allowed features are %',
                    quote_literal(feat #>> '{}'), quote_literal(eng), NEW.id, sandbox_allowed_features(eng)
                    USING ERRCODE = 'check_violation';
            END IF;
        END LOOP;
    END LOOP;

    IF TG_OP = 'INSERT' THEN
        NEW.generation := 1;
        NEW.created_at := now();
        NEW.updated_at := now();
    ELSE
        NEW.created_at := OLD.created_at;
        IF (NEW.owner, NEW.services, NEW.features, NEW.expires_at)
           IS DISTINCT FROM (OLD.owner, OLD.services, OLD.features, OLD.expires_at) THEN
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

CREATE TRIGGER sandbox_desired_validate
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_validate();

-- Wake controllers without polling: the payload is only the key.
CREATE FUNCTION sandbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], coalesce(NEW.id, OLD.id));
    RETURN NULL;
END
$$;

CREATE TRIGGER sandbox_desired_notify
    AFTER INSERT OR UPDATE OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_notify('sandbox_desired');

CREATE TRIGGER sandbox_status_notify
    AFTER INSERT OR UPDATE OR DELETE ON sandbox_status
    FOR EACH ROW EXECUTE FUNCTION sandbox_notify('sandbox_status');
