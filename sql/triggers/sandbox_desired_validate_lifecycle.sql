-- Checks the lifecycle columns; fires after the two above (name order), so
-- it sees whether they bumped the generation.
CREATE OR REPLACE TRIGGER sandbox_desired_validate_lifecycle
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_validate_lifecycle();
