-- A TRUNCATE of sandbox_desired sends '*': relist (sandbox_notify_truncate).
CREATE OR REPLACE TRIGGER sandbox_desired_notify_truncate
    AFTER TRUNCATE ON sandbox_desired
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_notify_truncate('sandbox_desired');
