-- Every row written (by sandbox_checkpoint and sandbox_reset, or by
-- sandboxd; orchestrators may not write these tables): its owner is its
-- sandbox's, a new request is of the sandbox's current incarnation, and a
-- new checkpoint stays within the limit. SECURITY DEFINER: it counts rows
-- the writer may not see.
CREATE OR REPLACE FUNCTION sandbox_checkpoints_validate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    d record;
    most integer;
    taken integer;
BEGIN
    SELECT s.owner, s.incarnation INTO d FROM sandbox_desired s WHERE s.id = NEW.sandbox_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no sandbox %: request it first (sandbox_request)', NEW.sandbox_id
            USING ERRCODE = 'no_data_found';
    END IF;
    IF NEW.owner IS DISTINCT FROM d.owner THEN
        RAISE EXCEPTION 'the owner of a checkpoint or reset of sandbox % must be the sandbox''s (%)', NEW.sandbox_id, d.owner
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'INSERT' AND NEW.incarnation IS DISTINCT FROM d.incarnation THEN
        RAISE EXCEPTION 'a checkpoint or reset of sandbox % must be of its current incarnation (%)', NEW.sandbox_id, d.incarnation
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_TABLE_NAME = 'sandbox_checkpoints' AND TG_OP = 'INSERT' THEN
        SELECT c.max_per_sandbox INTO most FROM sandbox_checkpoint_settings c;
        SELECT count(*) INTO taken FROM sandbox_checkpoints c
        WHERE c.sandbox_id = NEW.sandbox_id AND c.name <> NEW.name;
        IF taken >= coalesce(most, 8) THEN
            RAISE EXCEPTION 'sandbox % has % checkpoints, the most a sandbox may have (sandbox_checkpoint_settings.max_per_sandbox = %): take the new one under the name of one you no longer need (it is replaced)',
                NEW.sandbox_id, taken, coalesce(most, 8)
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
