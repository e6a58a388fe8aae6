-- Unregisters `role_name` and revokes all its privileges on every listed
-- object (a listed object that no longer exists is skipped); the schema's
-- USAGE only when this role may (it owns the schema or is a member of its
-- owner). Returns whether the role was registered.
CREATE OR REPLACE FUNCTION sandbox_revoke_orchestrator(role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    registered boolean;
    p record;
BEGIN
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'sandbox_revoke_orchestrator needs a role name'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    DELETE FROM sandbox_orchestrators o WHERE o.role = role_name;
    registered := FOUND;
    IF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
        FOR p IN
            SELECT DISTINCT o.object_kind, o.object,
                   CASE o.object_kind
                       WHEN 'function' THEN to_regprocedure(o.object)::text
                       WHEN 'schema' THEN to_regnamespace(o.object)::text
                       ELSE to_regclass(o.object)::text
                   END AS target
            FROM sandbox_orchestrator_privileges o
            ORDER BY o.object_kind, o.object
        LOOP
            CONTINUE WHEN p.target IS NULL;
            IF p.object_kind = 'schema' THEN
                IF pg_has_role((SELECT nspowner FROM pg_namespace WHERE oid = to_regnamespace(p.object)), 'USAGE') THEN
                    EXECUTE format('REVOKE USAGE ON SCHEMA %s FROM %I', p.target, role_name);
                END IF;
            ELSE
                EXECUTE format('REVOKE ALL ON %s %s FROM %I', upper(p.object_kind), p.target, role_name);
            END IF;
        END LOOP;
    END IF;
    RETURN registered;
END
$$;
