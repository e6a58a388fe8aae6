-- The owner's alone: orchestrators may not even read the list.
REVOKE ALL ON TABLE sandbox_orchestrator_privileges FROM PUBLIC;
