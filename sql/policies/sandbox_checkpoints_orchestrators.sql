-- Orchestrators see and request checkpoints of the rows they may access.
ALTER TABLE sandbox_checkpoints ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_checkpoints_orchestrators ON sandbox_checkpoints;
CREATE POLICY sandbox_checkpoints_orchestrators ON sandbox_checkpoints TO PUBLIC
    USING (sandbox_orchestrator_may_access(owner, current_user))
    WITH CHECK (sandbox_orchestrator_may_access(owner, current_user));
