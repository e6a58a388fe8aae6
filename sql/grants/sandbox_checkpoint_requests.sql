-- Only the owner draws request numbers (sandbox_checkpoint and
-- sandbox_reset run as it); orchestrators get nothing on it
-- (orchestrator_privileges.sql lists it as never granted).
REVOKE ALL ON SEQUENCE sandbox_checkpoint_requests FROM PUBLIC;
