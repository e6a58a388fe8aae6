-- Orchestrators see the checkpoints of the rows they may access; they
-- request them only through sandbox_checkpoint (they may not write here).
ALTER TABLE sandbox_checkpoints ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_checkpoints_orchestrators ON sandbox_checkpoints;
CREATE POLICY sandbox_checkpoints_orchestrators ON sandbox_checkpoints FOR SELECT TO PUBLIC
    USING (sandbox_caller_may_access(owner));
