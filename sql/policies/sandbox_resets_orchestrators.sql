-- Orchestrators see and request resets of the rows they may access.
ALTER TABLE sandbox_resets ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_resets_orchestrators ON sandbox_resets;
CREATE POLICY sandbox_resets_orchestrators ON sandbox_resets TO PUBLIC
    USING (sandbox_orchestrator_may_access(owner, current_user))
    WITH CHECK (sandbox_orchestrator_may_access(owner, current_user));
