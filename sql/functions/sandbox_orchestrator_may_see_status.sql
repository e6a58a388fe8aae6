-- The row-level security predicate of sandbox_status: a registered
-- orchestrator sees the status of a row it may access, and with own rows
-- only, only while the status is of that row's incarnation. An id is one
-- namespace for every owner and is reused: after tenant B releases `x`,
-- tenant A may insert `x` (even in a transaction it rolls back), and the
-- status still there is B's, of B's incarnation, which A never sees.
-- SECURITY DEFINER, as sandbox_orchestrator_may_access; it reads the
-- status's incarnation itself (the policy passes the id alone).
CREATE OR REPLACE FUNCTION sandbox_orchestrator_may_see_status(sandbox_id text, role_name name) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = role_name
          AND (NOT o.own_rows_only
               OR EXISTS (SELECT 1 FROM sandbox_status s
                          JOIN sandbox_desired d ON d.id = s.id AND d.incarnation = s.incarnation
                          WHERE s.id = sandbox_id AND d.owner = o.role::text)))
$$;
