-- A deleted row leaves a tombstone; an inserted one clears its id's.
CREATE OR REPLACE TRIGGER sandbox_desired_tombstone
    AFTER INSERT OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_tombstone();
