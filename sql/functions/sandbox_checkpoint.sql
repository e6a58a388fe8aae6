-- Asks for checkpoint p_name of sandbox p_id (replacing one of that name);
-- returns the request number. Raises when the name is not valid or
-- reserved, the sandbox is not one this role sees, it has the most
-- checkpoints it may, or the most requests pending
-- (sandbox_checkpoint_target). SECURITY DEFINER: the only writer of
-- sandbox_checkpoints besides sandboxd (orchestrators may not write it).
CREATE OR REPLACE FUNCTION sandbox_checkpoint(p_id text, p_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    d record;
    req bigint;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z0-9][a-z0-9_-]{0,30}$' THEN
        RAISE EXCEPTION 'checkpoint name % is not valid: use 1 to 31 characters from a-z, 0-9, "_" and "-", starting with a letter or digit',
            coalesce(sandbox_quote(p_name), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name = 'baseline' THEN
        RAISE EXCEPTION 'checkpoint name baseline is reserved (the empty database sandboxd records after provisioning; sandbox_reset(id) goes back to it): choose another name'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO d FROM sandbox_checkpoint_target(p_id, p_name);
    -- A checkpoint is a use of the sandbox (a paused one resumes for it).
    UPDATE sandbox_desired SET last_used_at = now() WHERE id = p_id;
    req := nextval('sandbox_checkpoint_requests');
    INSERT INTO sandbox_checkpoints AS c (sandbox_id, name, owner, incarnation, request)
    VALUES (p_id, p_name, d.row_owner, d.row_incarnation, req)
    ON CONFLICT (sandbox_id, name) DO UPDATE
        SET owner = EXCLUDED.owner, incarnation = EXCLUDED.incarnation, request = EXCLUDED.request,
            state = 'requested', message = '', size_bytes = NULL, instances = '{}'::jsonb,
            requested_at = now(), done_at = NULL;
    PERFORM sandbox_notify_send('sandbox_desired', d.row_incarnation::text);
    RETURN req;
END
$$;
