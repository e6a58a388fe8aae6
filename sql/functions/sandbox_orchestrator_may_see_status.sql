-- The row-level security predicate of sandbox_status: a registered
-- orchestrator sees the status of a row it may access. SECURITY DEFINER, as
-- sandbox_orchestrator_may_access.
CREATE OR REPLACE FUNCTION sandbox_orchestrator_may_see_status(sandbox_id text, role_name name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = role_name
          AND (NOT o.own_rows_only
               OR EXISTS (SELECT 1 FROM sandbox_desired d
                          WHERE d.id = sandbox_id AND d.owner = o.role::text)))
$$;
