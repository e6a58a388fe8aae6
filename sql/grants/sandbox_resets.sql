-- Orchestrators read it through the list (orchestrator_privileges.sql);
-- only sandbox_reset and sandboxd write it.
REVOKE ALL ON TABLE sandbox_resets FROM PUBLIC;
