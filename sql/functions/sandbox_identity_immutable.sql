-- The row of sandbox_identity cannot change or go: sandboxd labels its
-- containers with the state database's identity and leaves those of any
-- other identity alone.
CREATE OR REPLACE FUNCTION sandbox_identity_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the identity of this state database cannot change: sandboxd labels its containers with it and leaves those of any other identity alone; to start afresh, create a new database (sandboxd migrate gives it a new identity)'
        USING ERRCODE = 'check_violation';
END
$$;
