-- Every status write carries its writer's term in leader_term: a write
-- whose term is not the current, unexpired lease's is refused (SQLSTATE
-- SX001), so a deposed leader's late write never lands.
CREATE OR REPLACE FUNCTION sandbox_status_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.leader_term IS NULL OR NOT sandbox_lease_valid(NEW.leader_term) THEN
        RAISE EXCEPTION 'sandbox_status write refused: leader term % is not the current leader''s',
                        coalesce(NEW.leader_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
    RETURN NEW;
END
$$;
