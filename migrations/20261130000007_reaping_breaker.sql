-- sandboxd: the reaping circuit breaker's state.
--
-- When one look at the fleet finds too many sandboxes whose desired row is
-- missing without having been deleted (by default more than half, and at
-- least 5), the controller
-- pauses the reaping of deleted rows and records why here, so that the
-- pause outlives a restart and a standby that takes over keeps it. An
-- operator resumes with `sandboxd resume-reaping` (sandbox_resume_reaping
-- below), which also wakes the controller (NOTIFY '*': relist).

CREATE TABLE sandbox_reaping (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    paused     boolean NOT NULL DEFAULT false,
    reason     text NOT NULL DEFAULT '',
    paused_at  timestamptz NULL,
    resumed_at timestamptz NULL,
    resumed_by text NULL
);

INSERT INTO sandbox_reaping DEFAULT VALUES;

COMMENT ON TABLE sandbox_reaping IS
    'Whether sandboxd has paused reaping deleted rows (its circuit breaker tripped), why, and who resumed it';

-- Pauses reaping with p_reason (kept from the first trip while paused).
CREATE FUNCTION sandbox_pause_reaping(p_reason text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE sandbox_reaping SET paused = true, reason = p_reason, paused_at = now()
     WHERE NOT paused
$$;

-- Resumes reaping; returns whether it was paused, why and since when, and
-- wakes the controller.
CREATE FUNCTION sandbox_resume_reaping()
RETURNS TABLE (was_paused boolean, reason text, paused_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    previous sandbox_reaping%ROWTYPE;
BEGIN
    SELECT * INTO previous FROM sandbox_reaping FOR UPDATE;
    UPDATE sandbox_reaping
       SET paused = false, resumed_at = now(), resumed_by = session_user
     WHERE paused;
    PERFORM pg_notify('sandbox_desired', '*');
    RETURN QUERY SELECT coalesce(previous.paused, false), coalesce(previous.reason, ''), previous.paused_at;
END
$$;

-- Tombstones: a row removed by DELETE (sandbox_release, sandboxd release,
-- a DELETE by hand) leaves its id here, a row-level signal that the
-- deletion was meant. The breaker counts only rows that vanished without
-- one: a TRUNCATE, an emptied or restored database. Re-inserting the id
-- clears its tombstone; sandboxd prunes tombstones after a week.
CREATE TABLE sandbox_released (
    id          text PRIMARY KEY,
    released_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE sandbox_released IS
    'Ids whose desired row was deleted row by row (not truncated): sandboxd reaps them without counting them against its reaping breaker';

-- SECURITY DEFINER: orchestrators delete rows, but may not write here.
CREATE FUNCTION sandbox_desired_tombstone() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO sandbox_released (id) VALUES (OLD.id)
            ON CONFLICT (id) DO UPDATE SET released_at = now();
        RETURN OLD;
    END IF;
    DELETE FROM sandbox_released WHERE id = NEW.id;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_desired_tombstone
    AFTER INSERT OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_tombstone();

REVOKE EXECUTE ON FUNCTION sandbox_pause_reaping(text), sandbox_resume_reaping(),
                           sandbox_desired_tombstone() FROM PUBLIC;

DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sandbox_pause_reaping(text) SET search_path = pg_catalog, %I, pg_temp', schema_name);
    EXECUTE format('ALTER FUNCTION sandbox_resume_reaping() SET search_path = pg_catalog, %I, pg_temp', schema_name);
    EXECUTE format('ALTER FUNCTION sandbox_desired_tombstone() SET search_path = pg_catalog, %I, pg_temp', schema_name);
END
$$;
