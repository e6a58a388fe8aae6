-- Checks idle_action; fires after sandbox_desired_validate and before
-- sandbox_desired_validate_lifecycle (name order).
CREATE OR REPLACE TRIGGER sandbox_desired_validate_idle_action
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_validate_idle_action();
