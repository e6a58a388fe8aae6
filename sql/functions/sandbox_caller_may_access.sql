-- Whether the calling role may read and write the rows of owner
-- row_owner: a registered orchestrator, not restricted to its own rows or
-- whose own they are. The row-level security predicate (every policy but
-- the status's), and the check of the verbs that write as the tables'
-- owner for their caller (sandbox_seed_put, sandbox_seed_delete,
-- sandbox_seed_engine, sandbox_checkpoint_target).
--
-- It takes no role to judge: every orchestrator may call it (the policies
-- do, as the querying role), and it answers for the caller alone. With a
-- role argument, a tenant asked it about another tenant (issue 50). The
-- caller is the session's role (SET ROLE's, else the login role), as in
-- the verbs: SECURITY DEFINER, so that it reads sandbox_orchestrators,
-- which orchestrators may not, makes current_user the owner here. A
-- policy runs as the querying role, which is the session's unless a
-- SECURITY DEFINER function runs the query (sandboxd's are the tables'
-- owner's, which row-level security does not filter).
CREATE OR REPLACE FUNCTION sandbox_caller_may_access(row_owner text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandbox_orchestrators o
        WHERE o.role = coalesce(nullif(current_setting('role'), 'none'), session_user)
          AND (NOT o.own_rows_only OR row_owner = o.role::text))
$$;
