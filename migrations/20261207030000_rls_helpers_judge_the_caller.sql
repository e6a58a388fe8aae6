-- The row-level security helpers took the role to judge as an argument,
-- and every orchestrator could call them: a tenant asked them about
-- another tenant's role and learned which sandboxes it owns and that they
-- run (issue 50). sql/ now defines sandbox_caller_may_access(text) and
-- sandbox_caller_may_see_status(text), which judge the calling role and
-- take none; the old two go, and every privilege on them with them.
--
-- CASCADE: the policies that still call them (in every database but one
-- adopted from before the baseline, whose sql/ was applied before this
-- runs) go too; the apply of sql/ right after the migrations creates
-- them again, calling the new helpers. Until then an orchestrator sees no
-- row (row-level security without a policy admits none), never more.
DROP FUNCTION IF EXISTS sandbox_orchestrator_may_access(text, name) CASCADE;
DROP FUNCTION IF EXISTS sandbox_orchestrator_may_see_status(text, name) CASCADE;
