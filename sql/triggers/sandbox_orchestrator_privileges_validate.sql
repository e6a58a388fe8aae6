-- Every row of the privilege list names an existing object, normalised.
CREATE OR REPLACE TRIGGER sandbox_orchestrator_privileges_validate
    BEFORE INSERT OR UPDATE ON sandbox_orchestrator_privileges
    FOR EACH ROW EXECUTE FUNCTION sandbox_orchestrator_privileges_validate();
