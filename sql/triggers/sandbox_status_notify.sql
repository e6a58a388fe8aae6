-- Wakes clients waiting for a status (the payload is the status's
-- incarnation, never its id: see sandbox_notify).
CREATE OR REPLACE TRIGGER sandbox_status_notify
    AFTER INSERT OR UPDATE OR DELETE ON sandbox_status
    FOR EACH ROW EXECUTE FUNCTION sandbox_notify('sandbox_status');
