-- A released sandbox's checkpoints and resets go with its row.
CREATE OR REPLACE TRIGGER sandbox_desired_forget_checkpoints
    AFTER DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_checkpoints_forget();
