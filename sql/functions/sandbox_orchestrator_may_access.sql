-- The row-level security predicates. SECURITY DEFINER so that they read
-- sandbox_orchestrators (and, for statuses, the desired row's owner) as the
-- owner; the policies pass `current_user`, which inside a SECURITY DEFINER
-- function would be the owner.
CREATE OR REPLACE FUNCTION sandbox_orchestrator_may_access(row_owner text, role_name name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = role_name
          AND (NOT o.own_rows_only OR row_owner = o.role::text))
$$;
