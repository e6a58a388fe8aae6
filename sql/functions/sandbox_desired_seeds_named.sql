-- Keeps sandbox_seeds.last_named_at: a row that names a seed, or stops
-- naming it (its seeds changed, or it was deleted), marks it named now.
-- The leader deletes a seed no row names and none named for
-- --seed-retention; a seed a row starts to name while that delete runs is
-- kept (the delete re-reads the row this updated, and finds it named
-- just now). SECURITY DEFINER: orchestrators write rows, but may not
-- write sandbox_seeds.
CREATE OR REPLACE FUNCTION sandbox_desired_seeds_named() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.owner, NEW.seeds) IS NOT DISTINCT FROM (OLD.owner, OLD.seeds) THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' AND jsonb_typeof(OLD.seeds) = 'object' THEN
        UPDATE sandbox_seeds s SET last_named_at = now()
         WHERE s.owner = OLD.owner
           AND s.hash IN (SELECT e.value FROM jsonb_each_text(OLD.seeds) e);
    END IF;
    IF TG_OP <> 'DELETE' AND jsonb_typeof(NEW.seeds) = 'object' THEN
        UPDATE sandbox_seeds s SET last_named_at = now()
         WHERE s.owner = NEW.owner
           AND s.hash IN (SELECT e.value FROM jsonb_each_text(NEW.seeds) e);
    END IF;
    RETURN NULL;
END
$$;
