-- Wakes controllers on a new row or a deleted one (the payload is the
-- row's incarnation, never its id: see sandbox_notify).
CREATE OR REPLACE TRIGGER sandbox_desired_notify
    AFTER INSERT OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_notify('sandbox_desired');
