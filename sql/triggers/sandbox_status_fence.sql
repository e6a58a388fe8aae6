-- Refuses a status write of a deposed leader.
CREATE OR REPLACE TRIGGER sandbox_status_fence
    BEFORE INSERT OR UPDATE ON sandbox_status
    FOR EACH ROW EXECUTE FUNCTION sandbox_status_fence();
