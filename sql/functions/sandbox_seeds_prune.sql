-- Deletes the seeds that no desired row names and none named for
-- p_unnamed_for (sandbox_seeds.last_named_at, kept by the trigger
-- sandbox_desired_seeds_named; a put counts as named) and returns how many
-- it deleted. The leader runs it at its relists (--seed-retention).
--
-- The candidates are locked first, then counted as unnamed with a
-- snapshot taken after that: a row naming one commits before (its
-- validation holds the seed FOR KEY SHARE, so the lock waits for it) and is
-- seen, or waits for this and finds the seed gone (refused, as a row
-- naming an unknown seed is). Seeds locked by a put or a delete are left
-- for the next run.
CREATE OR REPLACE FUNCTION sandbox_seeds_prune(p_unnamed_for interval)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_candidates text[];
    v_deleted bigint;
BEGIN
    SELECT array_agg(s.owner || ' ' || s.hash) INTO v_candidates
      FROM (SELECT s.owner, s.hash FROM sandbox_seeds s
             WHERE s.last_named_at < now() - p_unnamed_for
               FOR UPDATE SKIP LOCKED) s;
    IF v_candidates IS NULL THEN
        RETURN 0;
    END IF;
    DELETE FROM sandbox_seeds s
     WHERE s.owner || ' ' || s.hash = ANY (v_candidates)
       AND NOT EXISTS (SELECT 1 FROM sandbox_desired d
                        WHERE d.owner = s.owner
                          AND jsonb_typeof(d.seeds) = 'object'
                          AND EXISTS (SELECT 1 FROM jsonb_each_text(d.seeds) e WHERE e.value = s.hash));
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;
