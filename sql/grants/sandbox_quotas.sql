-- Every role may read sandbox_quotas: row-level security hides every row
-- from a role that sandbox_grant_orchestrator did not register.
REVOKE ALL ON TABLE sandbox_quotas FROM PUBLIC;
GRANT SELECT ON TABLE sandbox_quotas TO PUBLIC;
