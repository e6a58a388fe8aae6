-- sandboxd: per-owner quotas (admission).
--
-- * One row per owner; the reserved owner '*' holds the default for every
--   owner without a row of its own. An owner's row replaces the default as
--   a whole (it is not merged column by column): NULL in a column means
--   unlimited. No row for the owner and no '*' row: unlimited.
-- * max_sandboxes bounds the owner's admitted sandboxes (rows that hold
--   containers or published credentials); max_memory_bytes bounds the sum
--   of their engines' memory caps (--memory, 512 MiB per engine by default).
-- * Written by the operator (the role that owns sandboxd's tables, with
--   `sandboxd quota set|unset`); sandboxd reads it when it admits a row.
--   A lower limit never evicts what runs: it holds back new rows only.
-- * Registered orchestrators may read the default row and the rows of
--   owners they may access (own rows only: their own): SELECT is granted to
--   PUBLIC and row-level security hides every row from a role that
--   sandbox_grant_orchestrator did not register, so the grant and revoke
--   functions stay as migration 09 left them.

CREATE TABLE sandbox_quotas (
    owner            text PRIMARY KEY
        CHECK (length(owner) BETWEEN 1 AND 200 AND owner !~ '[[:cntrl:]]'),
    max_sandboxes    integer NULL CHECK (max_sandboxes >= 0),
    max_memory_bytes bigint NULL CHECK (max_memory_bytes >= 0),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE sandbox_quotas IS
    'Per-owner limits on admitted sandboxes and the sum of their memory caps; owner ''*'' is the default, an owner''s row replaces it, NULL is unlimited; written by the operator (sandboxd quota set)';

ALTER TABLE sandbox_quotas ENABLE ROW LEVEL SECURITY;
CREATE POLICY sandbox_quotas_orchestrators ON sandbox_quotas FOR SELECT TO PUBLIC
    USING (sandbox_orchestrator_may_access(
        CASE WHEN owner = '*' THEN current_user::text ELSE owner END, current_user));

REVOKE ALL ON TABLE sandbox_quotas FROM PUBLIC;
GRANT SELECT ON TABLE sandbox_quotas TO PUBLIC;

-- The limits that apply to p_owner: its own row, else the default row
-- ('*'), else none (every column NULL: unlimited). `source` says which.
CREATE FUNCTION sandbox_quota_for(p_owner text)
RETURNS TABLE (source text, max_sandboxes integer, max_memory_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT q.owner, q.max_sandboxes, q.max_memory_bytes
      FROM sandbox_quotas q
     WHERE q.owner = p_owner OR q.owner = '*'
     ORDER BY (q.owner = '*')
     LIMIT 1
$$;

REVOKE EXECUTE ON FUNCTION sandbox_quota_for(text) FROM PUBLIC;

DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sandbox_quota_for(text) SET search_path = pg_catalog, %I, pg_temp',
                   schema_name);
END
$$;
