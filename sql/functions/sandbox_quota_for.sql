-- The limits that apply to p_owner: its own row, else the default row
-- ('*'), else the built-in defaults (`source` NULL): no limit on sandboxes
-- and memory, 16 seeds of 64 MiB together (the columns' defaults in
-- sandbox_quotas, so a row that does not say has the same). NULL is
-- unlimited. plpgsql: the seed columns are named only when it runs (see
-- sql/README.md).
CREATE OR REPLACE FUNCTION sandbox_quota_for(p_owner text)
RETURNS TABLE (source text, max_sandboxes integer, max_memory_bytes bigint,
               max_seeds integer, max_seed_bytes bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT q.owner, q.max_sandboxes, q.max_memory_bytes, q.max_seeds, q.max_seed_bytes
      FROM sandbox_quotas q
     WHERE q.owner = p_owner OR q.owner = '*'
     ORDER BY (q.owner = '*')
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::text, NULL::integer, NULL::bigint, 16, 67108864::bigint;
    END IF;
END
$$;
