-- A TRUNCATE of sandbox_desired takes every checkpoint and reset with it.
CREATE OR REPLACE TRIGGER sandbox_desired_truncate_checkpoints
    AFTER TRUNCATE ON sandbox_desired
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_checkpoints_forget();
