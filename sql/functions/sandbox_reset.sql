-- Asks for sandbox p_id's data to go back to checkpoint p_name (NULL or
-- 'baseline': the baseline); returns the request number. Raises when the
-- sandbox is not one this role sees or has no such checkpoint.
CREATE OR REPLACE FUNCTION sandbox_reset(p_id text, p_name text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    d record;
    target text := coalesce(p_name, 'baseline');
    req bigint;
BEGIN
    SELECT s.owner, s.incarnation INTO d FROM sandbox_desired s WHERE s.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no sandbox % that this role may see: request it first (sandbox_request)', coalesce(sandbox_quote(p_id), 'NULL')
            USING ERRCODE = 'no_data_found';
    END IF;
    IF target <> 'baseline' AND NOT EXISTS (
        SELECT 1 FROM sandbox_checkpoints c
        WHERE c.sandbox_id = p_id AND c.name = target AND c.state <> 'failed'
          AND c.incarnation IS NOT DISTINCT FROM d.incarnation)
    THEN
        RAISE EXCEPTION 'sandbox % has no checkpoint %: take it first (sandbox_checkpoint), or reset to the baseline (sandbox_reset(id)); its checkpoints: %',
            sandbox_quote(p_id), coalesce(sandbox_quote(p_name), 'NULL'),
            coalesce((SELECT string_agg(c.name, ', ' ORDER BY c.name) FROM sandbox_checkpoints c
                      WHERE c.sandbox_id = p_id AND c.state <> 'failed'), 'none')
            USING ERRCODE = 'no_data_found';
    END IF;
    -- A reset is a use of the sandbox (a paused one resumes for it).
    UPDATE sandbox_desired SET last_used_at = now() WHERE id = p_id;
    req := nextval('sandbox_checkpoint_requests');
    INSERT INTO sandbox_resets (request, sandbox_id, checkpoint, owner, incarnation)
    VALUES (req, p_id, target, d.owner, d.incarnation);
    PERFORM pg_notify('sandbox_desired', p_id);
    RETURN req;
END
$$;
