-- Grants `role_name` exactly the privileges of sandbox_orchestrator_privileges,
-- revoking whatever else it had on the listed objects, and registers it for
-- the row-level security policies; with own_rows_only it sees and writes
-- only rows whose owner is its role name. Only the owner of the tables (the
-- controller) may call it.
CREATE OR REPLACE FUNCTION sandbox_grant_orchestrator(role_name name, own_rows_only boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF role_name IS NULL OR own_rows_only IS NULL THEN
        RAISE EXCEPTION 'sandbox_grant_orchestrator needs a role name and own_rows_only true or false'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
        RAISE EXCEPTION 'role % does not exist: create it first as a superuser (CREATE ROLE % LOGIN PASSWORD ''...''), then grant it again',
            quote_ident(role_name), quote_ident(role_name)
            USING ERRCODE = 'undefined_object';
    END IF;
    IF role_name LIKE 'pg\_%' THEN
        RAISE EXCEPTION 'role % is a predefined role: create a role of its own for the orchestrator', quote_ident(role_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF role_name = current_user THEN
        RAISE EXCEPTION 'role % is the role running this function (the owner of sandboxd''s tables): create another role for the orchestrator',
            quote_ident(role_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    PERFORM sandbox_revoke_orchestrator(role_name);
    PERFORM sandbox_apply_orchestrator_privileges(role_name);
    INSERT INTO sandbox_orchestrators (role, own_rows_only)
    VALUES (role_name, own_rows_only);
END
$$;
