-- Registers seed content for engine p_engine and returns its hash,
-- 'sha256:' and the hex SHA-256 of the engine's name, a zero byte and the
-- content (the engine is part of it: the same bytes are another seed for
-- another engine; the zero byte makes the encoding unambiguous, as no
-- engine name holds one). Idempotent: the same content again returns the
-- same hash and stores nothing (it starts the seed's --seed-retention
-- window again). The seed belongs to p_owner (default: the calling role);
-- only a role that may write that owner's rows may register for it, as
-- row-level security would allow. A new seed must fit the owner's seed
-- quota (sandbox_quota_for: max_seeds, max_seed_bytes, its whole size
-- counted); puts of one owner take turns (an advisory lock per owner), so
-- two at once cannot both fit under it. SECURITY DEFINER: the only writer
-- of sandbox_seeds (orchestrators can neither read nor write it).
CREATE OR REPLACE FUNCTION sandbox_seed_put(p_engine text, p_content bytea, p_owner text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    -- The largest seed: applied into a sandbox's memory-backed data.
    max_bytes CONSTANT integer := 16 * 1024 * 1024;
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
    v_owner text := coalesce(p_owner, caller::text);
    v_hash text;
    v_max_seeds integer;
    v_max_bytes bigint;
    v_source text;
    v_seeds bigint;
    v_bytes bigint;
    v_from text;
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
    -- One owner's puts take turns until their transactions end: each one
    -- counts what the one before it stored. (Two keys: the one-key form is
    -- the schema applier's.) Only a READ COMMITTED statement sees what was
    -- stored while it waited; a REPEATABLE READ or SERIALIZABLE
    -- transaction's snapshot predates the wait, and two at once would both
    -- fit.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'sandbox_seed_put counts the owner''s seeds against its quota and runs only in READ COMMITTED transactions (this one is %): call it outside a transaction or in a READ COMMITTED one',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('sandbox_seed_put'), hashtext(v_owner));
    UPDATE sandbox_seeds s SET last_named_at = now()
     WHERE s.owner = v_owner AND s.hash = v_hash;
    IF FOUND THEN
        RETURN v_hash;
    END IF;
    SELECT q.source, q.max_seeds, q.max_seed_bytes INTO v_source, v_max_seeds, v_max_bytes
      FROM sandbox_quota_for(v_owner) q;
    v_from := CASE WHEN v_source IS NULL THEN 'the built-in default'
                   ELSE 'quota row ' || sandbox_quote(v_source) END;
    SELECT count(*), coalesce(sum(s.size_bytes), 0) INTO v_seeds, v_bytes
      FROM sandbox_seeds s WHERE s.owner = v_owner;
    IF v_max_seeds IS NOT NULL AND v_seeds + 1 > v_max_seeds THEN
        RAISE EXCEPTION 'owner % holds % seeds (% bytes) and may hold at most % (seed quota from %): delete seeds it no longer names with sandbox_seed_delete(hash), or have the operator raise it with `sandboxd quota set OWNER --seeds N`',
            sandbox_quote(v_owner), v_seeds, v_bytes, v_max_seeds, v_from
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF v_max_bytes IS NOT NULL AND v_bytes + length(p_content) > v_max_bytes THEN
        RAISE EXCEPTION 'owner % holds % seeds of % bytes together; this one of % bytes would make % and the owner may hold at most % bytes (seed quota from %): delete seeds it no longer names with sandbox_seed_delete(hash), or have the operator raise it with `sandboxd quota set OWNER --seed-bytes SIZE`',
            sandbox_quote(v_owner), v_seeds, v_bytes, length(p_content), v_bytes + length(p_content), v_max_bytes,
            v_from
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    INSERT INTO sandbox_seeds (owner, hash, engine, content, size_bytes)
    VALUES (v_owner, v_hash, p_engine, p_content, length(p_content))
    ON CONFLICT (owner, hash) DO NOTHING;
    RETURN v_hash;
END
$$;
