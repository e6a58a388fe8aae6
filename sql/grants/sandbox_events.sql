-- Orchestrators read events through the list (orchestrator_privileges.sql)
-- and row-level security; PUBLIC gets nothing.
REVOKE ALL ON TABLE sandbox_events FROM PUBLIC;
