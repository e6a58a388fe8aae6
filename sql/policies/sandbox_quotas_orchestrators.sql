-- Orchestrators read the default row ('*') and the rows of owners they may access.
ALTER TABLE sandbox_quotas ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS sandbox_quotas_orchestrators ON sandbox_quotas;
CREATE POLICY sandbox_quotas_orchestrators ON sandbox_quotas FOR SELECT TO PUBLIC
    USING (sandbox_caller_may_access(CASE WHEN owner = '*' THEN current_user::text ELSE owner END));
