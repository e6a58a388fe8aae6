-- Orchestrators see the resets of the rows they may access; they request
-- them only through sandbox_reset (they may not write here).
ALTER TABLE sandbox_resets ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_resets_orchestrators ON sandbox_resets;
CREATE POLICY sandbox_resets_orchestrators ON sandbox_resets FOR SELECT TO PUBLIC
    USING (sandbox_caller_may_access(owner));
