-- The fence: refuses (SQLSTATE SX001) a write of `written` whose leader term
-- p_term is not the current, unexpired lease's, so that a deposed leader's
-- late write never lands. Every write of sandboxd's own state carries its
-- writer's term: statuses and pool claims (their fence triggers) and events
-- (sandbox_record_events).
CREATE OR REPLACE FUNCTION sandbox_lease_fence(p_term bigint, written text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_term IS NULL OR NOT sandbox_lease_valid(p_term) THEN
        RAISE EXCEPTION '% write refused: leader term % is not the current leader''s',
                        written, coalesce(p_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
END
$$;
