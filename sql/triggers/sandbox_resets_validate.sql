-- A reset's owner and incarnation are its sandbox's.
CREATE OR REPLACE TRIGGER sandbox_resets_validate
    BEFORE INSERT OR UPDATE ON sandbox_resets
    FOR EACH ROW EXECUTE FUNCTION sandbox_checkpoints_validate();
