-- sandboxd: TRUNCATE notifies.
--
-- TRUNCATE fires no row-level trigger, so emptying sandbox_desired (or
-- sandbox_status) sent no NOTIFY: the controller learned of it only at its
-- next periodic relist, and a client waiting for a status not at all. A
-- statement-level AFTER TRUNCATE trigger on each table now sends '*' on the
-- table's own channel: a payload no sandbox id can take (ids match
-- ^[a-z0-9][a-z0-9_-]{0,62}$), which means "every row may have changed".
-- The controller relists both sides on it; what it then finds without a
-- row is kept for the grace window counted from that moment (README,
-- "Semantics").
--
-- Unqualified names resolve to the tables' schema, as in the earlier
-- migrations; the DO block at the end pins the function's search_path.

CREATE FUNCTION sandbox_notify_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '*');
    RETURN NULL;
END
$$;

CREATE TRIGGER sandbox_desired_notify_truncate
    AFTER TRUNCATE ON sandbox_desired
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_notify_truncate('sandbox_desired');

CREATE TRIGGER sandbox_status_notify_truncate
    AFTER TRUNCATE ON sandbox_status
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_notify_truncate('sandbox_status');

-- A trigger function runs without an EXECUTE check: nobody needs to call it.
REVOKE EXECUTE ON FUNCTION sandbox_notify_truncate() FROM PUBLIC;

-- Pin the new function's search_path to the tables' schema, pg_temp last.
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sandbox_notify_truncate() SET search_path = pg_catalog, %I, pg_temp',
                   schema_name);
END
$$;
