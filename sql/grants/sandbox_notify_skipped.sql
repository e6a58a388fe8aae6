-- Only the owner draws it (sandbox_notify_send runs as it); orchestrators
-- get nothing on it (orchestrator_privileges.sql lists it as never granted).
REVOKE ALL ON SEQUENCE sandbox_notify_skipped FROM PUBLIC;
