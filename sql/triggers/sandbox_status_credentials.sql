-- Strips the credentials of a status that is not of its row's current
-- incarnation. BEFORE triggers fire in name order: before the fence, which
-- then sees the stripped row.
CREATE OR REPLACE TRIGGER sandbox_status_credentials
    BEFORE INSERT OR UPDATE ON sandbox_status
    FOR EACH ROW EXECUTE FUNCTION sandbox_status_credentials();
