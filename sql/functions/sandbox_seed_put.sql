-- Registers seed content for engine p_engine and returns its hash,
-- 'sha256:' and the hex SHA-256 of the engine's name, a zero byte and the
-- content (the engine is part of it: the same bytes are another seed for
-- another engine; the zero byte makes the encoding unambiguous, as no
-- engine name holds one). Idempotent: the same content again returns the
-- same hash and stores nothing. The seed belongs to p_owner (default: the
-- calling role); only a role that may write that owner's rows may register
-- for it, as row-level security would allow. SECURITY DEFINER: the only
-- writer of sandbox_seeds (orchestrators can neither read nor write it).
CREATE OR REPLACE FUNCTION sandbox_seed_put(p_engine text, p_content bytea, p_owner text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    -- The largest seed: applied into a sandbox's memory-backed data.
    max_bytes CONSTANT integer := 16 * 1024 * 1024;
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
    v_owner text := coalesce(p_owner, caller::text);
    v_hash text;
BEGIN
    IF p_engine IS NULL OR NOT EXISTS (SELECT 1 FROM sandbox_engines e WHERE e.engine = p_engine) THEN
        RAISE EXCEPTION 'seed engine % is not known: use one of %', coalesce(sandbox_quote(p_engine), 'NULL'), sandbox_allowed_engines()
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The engines whose sandboxd applies seeds (Engine::seed).
    IF p_engine NOT IN ('postgres', 'redis', 'valkey') THEN
        RAISE EXCEPTION 'engine % takes no seeds: seeds are for postgres (SQL text or a pg_dump -Fc archive), redis and valkey (commands, one per line, or an RDB file)', p_engine
            USING ERRCODE = 'feature_not_supported';
    END IF;
    IF p_content IS NULL OR length(p_content) = 0 THEN
        RAISE EXCEPTION 'seed content for engine % is empty: pass the SQL text or archive (postgres) or the commands or RDB file (redis, valkey) as bytes', p_engine
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(p_content) > max_bytes THEN
        RAISE EXCEPTION 'seed content for engine % is % bytes, more than the % a seed may hold: load the rest from the agent''s side, or split what is common into the seed',
            p_engine, length(p_content), max_bytes
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF length(v_owner) > 200 OR v_owner ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'seed owner % is not valid: at most 200 characters, no control characters', sandbox_quote(left(v_owner, 80))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (pg_has_role(caller, current_user, 'MEMBER')
            OR sandbox_caller_may_access(v_owner)) THEN
        RAISE EXCEPTION 'role % may not register seeds for owner %: register it as that owner (p_owner NULL) or with a role that may write its rows',
            caller, sandbox_quote(v_owner)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    v_hash := 'sha256:' || encode(sha256(convert_to(p_engine, 'UTF8') || '\x00'::bytea || p_content), 'hex');
    INSERT INTO sandbox_seeds (owner, hash, engine, content, size_bytes)
    VALUES (v_owner, v_hash, p_engine, p_content, length(p_content))
    ON CONFLICT (owner, hash) DO NOTHING;
    RETURN v_hash;
END
$$;
