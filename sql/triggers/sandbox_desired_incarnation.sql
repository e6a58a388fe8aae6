-- Owns `incarnation`: new on insert, kept on update.
CREATE OR REPLACE TRIGGER sandbox_desired_incarnation
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_incarnation();
