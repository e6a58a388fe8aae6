-- Issue 29: the isolation level a row asks for. NULL (every row before
-- this migration): the controller's --runtime decides; 'container': Docker's
-- default runtime; 'gvisor': gVisor's runsc (a user-space kernel between the
-- engines and the host's). The controller's --runtime is the least every
-- sandbox gets; a row may only raise it. The validation trigger
-- (sql/functions/sandbox_desired_validate.sql) refuses other values with a
-- message; this CHECK is the backstop.
ALTER TABLE sandbox_desired
    ADD COLUMN isolation text NULL
        CONSTRAINT sandbox_desired_isolation_check CHECK (isolation IN ('container', 'gvisor'));
