-- Orchestrators read and write the rows they may access (own rows only: theirs).
ALTER TABLE sandbox_desired ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_desired_orchestrators ON sandbox_desired;
CREATE POLICY sandbox_desired_orchestrators ON sandbox_desired TO PUBLIC
    USING (sandbox_caller_may_access(owner))
    WITH CHECK (sandbox_caller_may_access(owner));
