-- A deleted row's status loses its credentials in the same transaction.
CREATE OR REPLACE TRIGGER sandbox_desired_forget_credentials
    AFTER DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_status_forget_credentials();
