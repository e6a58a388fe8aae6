-- Wake controllers without polling: the payload is only the key.
CREATE OR REPLACE FUNCTION sandbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], coalesce(NEW.id, OLD.id));
    RETURN NULL;
END
$$;
