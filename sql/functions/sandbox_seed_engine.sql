-- The engine of the seed p_hash registered for owner p_owner, or NULL when
-- that owner registered no such seed. For the desired rows' validation,
-- which runs as the writing orchestrator (who may not read sandbox_seeds):
-- SECURITY DEFINER, and it tells only whether a hash exists for an owner
-- the caller writes a row for (row-level security keeps a restricted role
-- to its own owner, and so does this function: NULL for an owner whose
-- rows the calling role may not access).
CREATE OR REPLACE FUNCTION sandbox_seed_engine(p_owner text, p_hash text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
BEGIN
    IF NOT (pg_has_role(caller, current_user, 'MEMBER')
            OR sandbox_caller_may_access(p_owner)) THEN
        RETURN NULL;
    END IF;
    -- FOR KEY SHARE: a sandbox_seed_delete of it waits for the row being
    -- written to commit, and then sees it (hence VOLATILE).
    RETURN (SELECT s.engine FROM sandbox_seeds s WHERE s.owner = p_owner AND s.hash = p_hash FOR KEY SHARE);
END
$$;
