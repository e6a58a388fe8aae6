-- Deletes the seed p_hash registered for owner p_owner (default: the
-- calling role) and returns whether there was one: content registered by
-- mistake, or no longer wanted, leaves the state database. Refused while a
-- desired row of that owner names it (its sandboxes load it again on a
-- heal): release them or name another seed first. The same content of
-- another owner is another row, left alone. Only a role that may write
-- that owner's rows may delete, as for sandbox_seed_put. SECURITY DEFINER:
-- orchestrators can neither read nor write sandbox_seeds.
CREATE OR REPLACE FUNCTION sandbox_seed_delete(p_hash text, p_owner text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
    v_owner text := coalesce(p_owner, caller::text);
    v_naming bigint;
BEGIN
    IF NOT (pg_has_role(caller, current_user, 'MEMBER')
            OR sandbox_caller_may_access(v_owner)) THEN
        RAISE EXCEPTION 'role % may not delete seeds of owner %: delete it as that owner (p_owner NULL) or with a role that may write its rows',
            caller, sandbox_quote(v_owner)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Taken first: a row naming the seed that is being written waits for
    -- this (its validation reads the seed FOR KEY SHARE) or is seen below.
    PERFORM 1 FROM sandbox_seeds s WHERE s.owner = v_owner AND s.hash = p_hash FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT count(*) INTO v_naming
      FROM sandbox_desired d
     WHERE d.owner = v_owner
       AND EXISTS (SELECT 1 FROM jsonb_each_text(d.seeds) e WHERE e.value = p_hash);
    IF v_naming > 0 THEN
        RAISE EXCEPTION 'seed % is named by % sandbox row(s) of owner %: release them or name another seed in them first',
            p_hash, v_naming, sandbox_quote(v_owner)
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM sandbox_seeds s WHERE s.owner = v_owner AND s.hash = p_hash;
    RETURN true;
END
$$;
