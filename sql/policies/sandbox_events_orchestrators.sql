-- Orchestrators read the events whose owner they may access.
ALTER TABLE sandbox_events ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_events_orchestrators ON sandbox_events;
CREATE POLICY sandbox_events_orchestrators ON sandbox_events FOR SELECT TO PUBLIC
    USING (sandbox_caller_may_access(owner));
