-- Comma-separated, sorted list used in error messages.
CREATE OR REPLACE FUNCTION sandbox_allowed_engines() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(string_agg(engine, ', ' ORDER BY engine), '(none)') FROM sandbox_engines
$$;
