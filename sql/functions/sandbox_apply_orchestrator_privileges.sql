-- Grants role_name every privilege of sandbox_orchestrator_privileges
-- (adds; takes nothing away). For sandbox_grant_orchestrator, and for
-- sql/grants/orchestrator_privileges.sql, which gives the list to the
-- orchestrators registered already.
CREATE OR REPLACE FUNCTION sandbox_apply_orchestrator_privileges(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    FOR p IN
        SELECT o.object_kind, o.object,
               string_agg(o.privilege, ', ' ORDER BY o.privilege) AS privileges
        FROM sandbox_orchestrator_privileges o
        WHERE o.privilege IS NOT NULL
        GROUP BY o.object_kind, o.object
        ORDER BY o.object_kind, o.object
    LOOP
        -- The casts quote the names (and fail loudly if one is gone); the
        -- privileges are from the CHECK's fixed set.
        EXECUTE format('GRANT %s ON %s %s TO %I', p.privileges, upper(p.object_kind),
                       CASE p.object_kind
                           WHEN 'function' THEN p.object::regprocedure::text
                           WHEN 'schema' THEN p.object::regnamespace::text
                           ELSE p.object::regclass::text
                       END,
                       role_name);
    END LOOP;
END
$$;
