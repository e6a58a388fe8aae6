-- Per engine, the union of two feature maps ({"engine": ["feature", ...]},
-- each value an array of strings): every array sorted, each feature once.
CREATE OR REPLACE FUNCTION sandbox_features_union(existing jsonb, added jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(engines.engine, (
               SELECT coalesce(to_jsonb(array_agg(f.feature ORDER BY f.feature)), '[]'::jsonb)
               FROM (
                   SELECT DISTINCT x.feature COLLATE "C" AS feature
                   FROM (
                       SELECT jsonb_array_elements_text(coalesce(existing -> engines.engine, '[]'))
                       UNION ALL
                       SELECT jsonb_array_elements_text(coalesce(added -> engines.engine, '[]'))
                   ) x(feature)
               ) f)),
           '{}'::jsonb)
    FROM (
        SELECT jsonb_object_keys(coalesce(existing, '{}'))
        UNION
        SELECT jsonb_object_keys(coalesce(added, '{}'))
    ) engines(engine)
$$;
