-- A row removed by DELETE leaves its id in sandbox_released, a signal that
-- the deletion was meant (the reaping breaker counts only rows that
-- vanished without one); re-inserting the id clears it. It keeps the
-- row's incarnation, by which NOTIFY sandbox_desired named the deleted row
-- (the controller finds the id here). SECURITY DEFINER:
-- orchestrators delete rows, but may not write there.
CREATE OR REPLACE FUNCTION sandbox_desired_tombstone() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO sandbox_released (id, incarnation) VALUES (OLD.id, OLD.incarnation)
            ON CONFLICT (id) DO UPDATE SET released_at = now(), incarnation = EXCLUDED.incarnation;
        RETURN OLD;
    END IF;
    DELETE FROM sandbox_released WHERE id = NEW.id;
    RETURN NEW;
END
$$;
