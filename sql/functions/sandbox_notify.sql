-- Wakes controllers and waiting clients without polling. Any role that may
-- connect can LISTEN, so the payload names the row by its incarnation
-- (sandbox_desired.incarnation, or the status's), never by its id: a random
-- uuid per life of a row that names no id and no owner and opens nothing
-- (no function or policy takes one from a caller). A listener learns that
-- some row changed and which notifications are about the same row. The
-- controller finds the id (sandbox_desired, or sandbox_released for a
-- deleted row); a client compares it with the incarnation it waits for. A
-- status of no incarnation sends '*' (re-read).
CREATE OR REPLACE FUNCTION sandbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM sandbox_notify_send(TG_ARGV[0], coalesce(OLD.incarnation::text, '*'));
    ELSE
        PERFORM sandbox_notify_send(TG_ARGV[0], coalesce(NEW.incarnation::text, '*'));
    END IF;
    RETURN NULL;
END
$$;
