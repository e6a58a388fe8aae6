-- Comma-separated, sorted list of the features allowed for p_engine, used in
-- error messages.
CREATE OR REPLACE FUNCTION sandbox_allowed_features(p_engine text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(feature, ', ' ORDER BY feature), '(none)')
    FROM sandbox_engine_features WHERE engine = p_engine
$$;
