-- The identity row cannot be updated or deleted.
CREATE OR REPLACE TRIGGER sandbox_identity_immutable
    BEFORE UPDATE OR DELETE ON sandbox_identity
    FOR EACH ROW EXECUTE FUNCTION sandbox_identity_immutable();
