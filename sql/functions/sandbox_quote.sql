-- A value quoted for an error message: quote_literal, unless it holds
-- control characters (an ANSI escape sequence, a newline), which are then
-- shown JSON-escaped so that no message carries them raw.
CREATE OR REPLACE FUNCTION sandbox_quote(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN value IS NULL THEN 'NULL'
        WHEN left(value, 80) ~ '[[:cntrl:]]' THEN to_json(left(value, 80))::text
        ELSE quote_literal(left(value, 80))
    END
$$;
