-- A TRUNCATE of sandbox_status sends '*'.
CREATE OR REPLACE TRIGGER sandbox_status_notify_truncate
    AFTER TRUNCATE ON sandbox_status
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_notify_truncate('sandbox_status');
