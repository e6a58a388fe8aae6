-- Deletes the row (sandboxd tears the sandbox down); true if there was one
-- this role sees.
CREATE OR REPLACE FUNCTION sandbox_release(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
    DELETE FROM sandbox_desired d WHERE d.id = p_id;
    RETURN FOUND;
END
$$;
