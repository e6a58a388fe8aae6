-- A checkpoint's owner and incarnation are its sandbox's; at most
-- sandbox_checkpoint_settings.max_per_sandbox per sandbox.
CREATE OR REPLACE TRIGGER sandbox_checkpoints_validate
    BEFORE INSERT OR UPDATE ON sandbox_checkpoints
    FOR EACH ROW EXECUTE FUNCTION sandbox_checkpoints_validate();
