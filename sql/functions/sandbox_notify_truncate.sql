-- TRUNCATE fires no row-level trigger: this statement-level one sends '*'
-- on the table's own channel, a payload no sandbox id can take (ids match
-- ^[a-z0-9][a-z0-9_-]{0,62}$), which means "every row may have changed".
-- The controller relists both sides on it.
CREATE OR REPLACE FUNCTION sandbox_notify_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '*');
    RETURN NULL;
END
$$;
