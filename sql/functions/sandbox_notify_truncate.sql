-- TRUNCATE fires no row-level trigger: this statement-level one sends '*'
-- on the table's own channel, a payload no incarnation can be, which means
-- "every row may have changed". Any role may send NOTIFY too, so a
-- controller relists on '*' only when sandbox_relist_requests moved, which
-- only the owner (who alone may TRUNCATE) can make it do; a client waiting
-- for a status just reads it again.
CREATE OR REPLACE FUNCTION sandbox_notify_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_ARGV[0] = 'sandbox_desired' THEN
        PERFORM nextval('sandbox_relist_requests');
    END IF;
    PERFORM sandbox_notify_send(TG_ARGV[0], '*');
    RETURN NULL;
END
$$;
