-- Nor truncated.
CREATE OR REPLACE TRIGGER sandbox_identity_no_truncate
    BEFORE TRUNCATE ON sandbox_identity
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_identity_immutable();
