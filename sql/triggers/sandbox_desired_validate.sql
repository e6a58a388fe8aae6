-- Rejects invalid desired rows with a message that names what is allowed;
-- owns generation, created_at and updated_at. BEFORE triggers fire in name
-- order: this one first.
CREATE OR REPLACE TRIGGER sandbox_desired_validate
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_validate();
