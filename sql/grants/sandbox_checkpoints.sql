-- Orchestrators get it through the list (orchestrator_privileges.sql).
REVOKE ALL ON TABLE sandbox_checkpoints FROM PUBLIC;
