-- Asks for sandbox p_id's data to go back to checkpoint p_name (NULL or
-- 'baseline': the baseline); returns the request number. Raises when the
-- sandbox is not one this role sees, has no such checkpoint (of its
-- incarnation), or has the most requests pending (sandbox_checkpoint_target).
-- SECURITY DEFINER: the only writer of sandbox_resets besides sandboxd
-- (orchestrators may not write it).
CREATE OR REPLACE FUNCTION sandbox_reset(p_id text, p_name text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    d record;
    target text := coalesce(p_name, 'baseline');
    req bigint;
BEGIN
    SELECT * INTO d FROM sandbox_checkpoint_target(p_id, NULL);
    IF target <> 'baseline' AND NOT EXISTS (
        SELECT 1 FROM sandbox_checkpoints c
        WHERE c.sandbox_id = p_id AND c.name = target AND c.state <> 'failed'
          AND c.incarnation IS NOT DISTINCT FROM d.row_incarnation)
    THEN
        RAISE EXCEPTION 'sandbox % has no checkpoint %: take it first (sandbox_checkpoint), or reset to the baseline (sandbox_reset(id)); its checkpoints: %',
            sandbox_quote(p_id), coalesce(sandbox_quote(p_name), 'NULL'),
            coalesce((SELECT string_agg(c.name, ', ' ORDER BY c.name) FROM sandbox_checkpoints c
                      WHERE c.sandbox_id = p_id AND c.state <> 'failed'
                        AND c.incarnation IS NOT DISTINCT FROM d.row_incarnation), 'none')
            USING ERRCODE = 'no_data_found';
    END IF;
    -- A reset is a use of the sandbox (a paused one resumes for it).
    UPDATE sandbox_desired SET last_used_at = now() WHERE id = p_id;
    req := nextval('sandbox_checkpoint_requests');
    INSERT INTO sandbox_resets (request, sandbox_id, checkpoint, owner, incarnation)
    VALUES (req, p_id, target, d.row_owner, d.row_incarnation);
    PERFORM sandbox_notify_send('sandbox_desired', d.row_incarnation::text);
    RETURN req;
END
$$;
