-- Orchestrators read the statuses of the rows they may access, of the
-- rows' current incarnation (see sandbox_caller_may_see_status).
ALTER TABLE sandbox_status ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_status_orchestrators ON sandbox_status;
CREATE POLICY sandbox_status_orchestrators ON sandbox_status FOR SELECT TO PUBLIC
    USING (sandbox_caller_may_see_status(id));
