-- The row-level security predicate of sandbox_status: the calling role (as
-- sandbox_caller_may_access judges it, and for the same reasons: no role
-- argument, SECURITY DEFINER) sees the status of a row it may access, and
-- with own rows only, only while the status is of that row's incarnation.
-- An id is one namespace for every owner and is reused: after tenant B
-- releases `x`, tenant A may insert `x` (even in a transaction it rolls
-- back), and the status still there is B's, of B's incarnation, which A
-- never sees. It reads the status's incarnation itself (the policy passes
-- the id alone).
CREATE OR REPLACE FUNCTION sandbox_caller_may_see_status(status_id text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = coalesce(nullif(current_setting('role'), 'none'), session_user)
          AND (NOT o.own_rows_only
               OR EXISTS (SELECT 1 FROM sandbox_status s
                          JOIN sandbox_desired d ON d.id = s.id AND d.incarnation = s.incarnation
                          WHERE s.id = status_id AND d.owner = o.role::text)))
$$;
