-- The limits that apply to p_owner: its own row, else the default row
-- ('*'), else none (every column NULL: unlimited). `source` says which.
CREATE OR REPLACE FUNCTION sandbox_quota_for(p_owner text)
RETURNS TABLE (source text, max_sandboxes integer, max_memory_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT q.owner, q.max_sandboxes, q.max_memory_bytes
      FROM sandbox_quotas q
     WHERE q.owner = p_owner OR q.owner = '*'
     ORDER BY (q.owner = '*')
     LIMIT 1
$$;
