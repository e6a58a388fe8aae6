-- Refuses a write of sandbox_pool_claims whose leader_term is not the
-- current, unexpired lease's (SQLSTATE SX001), as sandbox_status_fence does
-- for statuses.
CREATE OR REPLACE FUNCTION sandbox_pool_claims_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.leader_term IS NULL OR NOT sandbox_lease_valid(NEW.leader_term) THEN
        RAISE EXCEPTION 'sandbox_pool_claims write refused: leader term % is not the current leader''s',
                        coalesce(NEW.leader_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
    RETURN NEW;
END
$$;
