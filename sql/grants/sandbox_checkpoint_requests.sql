-- Orchestrators get USAGE through the list (orchestrator_privileges.sql).
REVOKE ALL ON SEQUENCE sandbox_checkpoint_requests FROM PUBLIC;
