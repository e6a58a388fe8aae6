-- `existing` in order, then the entries of `added` it lacks, each once in
-- the order first given. NULL entries are kept (once), so that the
-- validation trigger refuses them.
CREATE OR REPLACE FUNCTION sandbox_array_union(existing text[], added text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(entry ORDER BY source, position), '{}')
    FROM (
        SELECT DISTINCT ON (entry) entry, source, position
        FROM (
            SELECT e.entry, 1 AS source, e.position
            FROM unnest(existing) WITH ORDINALITY AS e(entry, position)
            UNION ALL
            SELECT a.entry, 2, a.position
            FROM unnest(added) WITH ORDINALITY AS a(entry, position)
        ) both_lists
        ORDER BY entry, source, position
    ) firsts
$$;
