-- Checks the lifecycle columns and owns last_used_at and requested_at;
-- on UPDATE bumps `generation` when idle_timeout, owner_container or
-- requested_at changed and sandbox_desired_validate did not bump it already.
CREATE OR REPLACE FUNCTION sandbox_desired_validate_lifecycle() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- idle_timeout at most this many seconds (365 days).
    max_idle_seconds CONSTANT numeric := 31536000;
    idle_seconds numeric;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.id IS DISTINCT FROM OLD.id THEN
        RAISE EXCEPTION 'the id of sandbox % cannot change: release it (sandbox_release) and request % as a new sandbox',
            OLD.id, NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- idle_timeout: NULL (the controller's default) or 0 to 365 days, stored
    -- as a plain duration (no months or days), so that the controller and
    -- SQL agree on when it has passed.
    IF NEW.idle_timeout IS NOT NULL THEN
        IF NOT isfinite(NEW.idle_timeout) THEN
            RAISE EXCEPTION 'idle_timeout of sandbox % is %: use an interval from 0 (never idle-released) to 365 days, or NULL for the controller''s default (--idle-timeout)',
                NEW.id, NEW.idle_timeout
                USING ERRCODE = 'check_violation';
        END IF;
        idle_seconds := EXTRACT(EPOCH FROM NEW.idle_timeout);
        IF idle_seconds < 0 OR idle_seconds > max_idle_seconds THEN
            RAISE EXCEPTION 'idle_timeout of sandbox % is %: use an interval from 0 (never idle-released) to 365 days, or NULL for the controller''s default (--idle-timeout)',
                NEW.id, NEW.idle_timeout
                USING ERRCODE = 'check_violation';
        END IF;
        NEW.idle_timeout := (idle_seconds * 1000000)::bigint * interval '1 microsecond';
    END IF;

    -- owner_container: a Docker container name, like the attach entries.
    IF NEW.owner_container IS NOT NULL
       AND NEW.owner_container !~ '^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid owner_container % of sandbox %: use a Docker container name, 1 to 128 characters from a-z, A-Z, 0-9, "_", "." and "-", starting with a letter or digit, or NULL for none',
            sandbox_quote(NEW.owner_container), NEW.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- persistent: fixed at insert (its data lives on a volume of its own).
    IF NEW.persistent IS NULL THEN
        RAISE EXCEPTION 'persistent of sandbox % is NULL: use true (data on a Docker volume) or false (data on tmpfs)', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.persistent <> OLD.persistent THEN
        RAISE EXCEPTION 'persistent of sandbox % cannot change (it is %): release the sandbox (sandbox_release; this discards its data) and request it again with persistent = %',
            NEW.id, OLD.persistent::text, NEW.persistent::text
            USING ERRCODE = 'check_violation';
    END IF;

    -- fork_of: fixed at insert; a sandbox of the same owner that the
    -- inserting role sees (row-level security applies here: a source it
    -- cannot see is not found), named with its incarnation.
    IF TG_OP = 'UPDATE'
       AND (NEW.fork_of, NEW.fork_of_incarnation) IS DISTINCT FROM (OLD.fork_of, OLD.fork_of_incarnation) THEN
        RAISE EXCEPTION 'fork_of of sandbox % cannot change: it names the sandbox whose data it started with; release it (sandbox_release) and fork again (sandbox_fork)',
            NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'INSERT' AND (NEW.fork_of IS NOT NULL OR NEW.fork_of_incarnation IS NOT NULL) THEN
        IF NEW.fork_of IS NULL OR NEW.fork_of_incarnation IS NULL THEN
            RAISE EXCEPTION 'sandbox % names fork_of without fork_of_incarnation (or the other way round): fork with sandbox_fork(source, id), which sets both',
                NEW.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.persistent THEN
            RAISE EXCEPTION 'sandbox % cannot be a persistent fork: a fork is a throwaway copy (its data is on tmpfs); fork without persistent',
                NEW.id
                USING ERRCODE = 'check_violation';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM sandbox_desired s
                       WHERE s.id = NEW.fork_of AND s.owner = NEW.owner
                         AND s.incarnation = NEW.fork_of_incarnation) THEN
            RAISE EXCEPTION 'sandbox % to fork from is not found (for owner %, as incarnation %): fork a sandbox of the same owner that this role sees, with sandbox_fork(source, id)',
                sandbox_quote(NEW.fork_of), sandbox_quote(NEW.owner), NEW.fork_of_incarnation
                USING ERRCODE = 'no_data_found';
        END IF;
    END IF;

    IF TG_OP = 'INSERT' THEN
        IF NEW.requested_at IS NOT NULL THEN
            NEW.requested_at := clock_timestamp();
        END IF;
        NEW.last_used_at := now();
        RETURN NEW;
    END IF;

    -- requested_at only ever moves forward, to the time of the write.
    IF NEW.requested_at IS NOT NULL AND NEW.requested_at IS DISTINCT FROM OLD.requested_at THEN
        NEW.requested_at := greatest(clock_timestamp(),
                                     coalesce(OLD.requested_at + interval '1 microsecond', '-infinity'));
    END IF;
    IF NEW.generation = OLD.generation
       AND (NEW.idle_timeout, NEW.owner_container, NEW.requested_at)
           IS DISTINCT FROM (OLD.idle_timeout, OLD.owner_container, OLD.requested_at) THEN
        NEW.generation := OLD.generation + 1;
        NEW.updated_at := now();
    END IF;
    IF NEW.generation <> OLD.generation THEN
        NEW.last_used_at := now();
    ELSE
        -- At most now, and never backwards.
        NEW.last_used_at := greatest(OLD.last_used_at,
                                     least(coalesce(NEW.last_used_at, OLD.last_used_at), now()));
    END IF;
    RETURN NEW;
END
$$;
