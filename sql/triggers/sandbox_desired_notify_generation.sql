-- Wakes controllers on a new generation only: a touch (last_used_at alone)
-- stays silent.
CREATE OR REPLACE TRIGGER sandbox_desired_notify_generation
    AFTER UPDATE ON sandbox_desired
    FOR EACH ROW WHEN (OLD.generation IS DISTINCT FROM NEW.generation)
    EXECUTE FUNCTION sandbox_notify('sandbox_desired');
