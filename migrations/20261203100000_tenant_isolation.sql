-- Tenant isolation in the state database (issue 29).
--
-- Only additions, named by sql/ inside plpgsql bodies alone (a database
-- adopted from before the baseline gets sql/ applied before this runs).

-- Each tombstone keeps the incarnation of the row it marks: NOTIFY
-- sandbox_desired names a row by its incarnation, never by its id, and the
-- controller finds a deleted row's id here.
ALTER TABLE sandbox_released ADD COLUMN incarnation uuid NULL;
CREATE INDEX sandbox_released_incarnation ON sandbox_released (incarnation);

-- The most checkpoint and reset requests one sandbox may have pending
-- (state 'requested'); sandbox_checkpoint and sandbox_reset refuse more.
ALTER TABLE sandbox_checkpoint_settings
    ADD COLUMN max_pending_per_sandbox integer NOT NULL DEFAULT 8
        CHECK (max_pending_per_sandbox BETWEEN 1 AND 64);

-- Bumped by what may ask every controller to relist (a TRUNCATE of
-- sandbox_desired, sandbox_resume_reaping), all of them the owner's. Any
-- role may send NOTIFY sandbox_desired, '*': the controller relists only
-- when this moved. A new sequence grants PUBLIC nothing.
CREATE SEQUENCE sandbox_relist_requests;

-- Orchestrators no longer write the checkpoint tables or draw request
-- numbers themselves (the verbs do, as the tables' owner). The list in
-- sql/grants/orchestrator_privileges.sql only adds to registered roles:
-- take these from every role registered already.
DO $$
DECLARE
    r name;
BEGIN
    FOR r IN SELECT o.role FROM sandbox_orchestrators o
             WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.rolname = o.role)
    LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON TABLE sandbox_checkpoints, sandbox_resets FROM %I', r);
        EXECUTE format('REVOKE ALL ON SEQUENCE sandbox_checkpoint_requests FROM %I', r);
    END LOOP;
END
$$;
