-- Checks idle_action with a message that says what to do (the column's
-- CHECK is the backstop) and makes its change a new generation. Fires after
-- sandbox_desired_validate and before sandbox_desired_validate_lifecycle
-- (triggers fire in name order), which then moves last_used_at with the
-- new generation.
CREATE OR REPLACE FUNCTION sandbox_desired_validate_idle_action() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.idle_action IS NULL OR NEW.idle_action NOT IN ('release', 'pause') THEN
        RAISE EXCEPTION 'idle_action of sandbox % is %: use ''release'' (torn down once idle) or ''pause'' (frozen once idle, resumed by a request or a touch)',
            NEW.id, sandbox_quote(NEW.idle_action)
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.generation = OLD.generation
       AND NEW.idle_action IS DISTINCT FROM OLD.idle_action THEN
        NEW.generation := OLD.generation + 1;
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END
$$;
