-- Orchestrators read it through the list (orchestrator_privileges.sql);
-- only sandbox_checkpoint and sandboxd write it.
REVOKE ALL ON TABLE sandbox_checkpoints FROM PUBLIC;
