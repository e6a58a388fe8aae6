-- A released sandbox's checkpoints and resets go with its row (no foreign
-- key: sandbox_desired may be truncated); so do those of every row when the
-- table is truncated. SECURITY DEFINER: orchestrators delete rows, and may
-- not delete these.
CREATE OR REPLACE FUNCTION sandbox_checkpoints_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE sandbox_checkpoints, sandbox_resets;
        RETURN NULL;
    END IF;
    DELETE FROM sandbox_checkpoints c WHERE c.sandbox_id = OLD.id;
    DELETE FROM sandbox_resets r WHERE r.sandbox_id = OLD.id;
    RETURN NULL;
END
$$;
