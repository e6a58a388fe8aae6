-- Forks sandbox p_source into a new sandbox p_id of the same owner (p_owner,
-- when given, must be it): the same services, features and isolation,
-- its engines starting with a copy of the source's data as it is when
-- sandboxd makes the copy, under fresh credentials on a network of its
-- own. Returns the new row's generation (to wait for). Calling it again
-- for the same fork of the same source returns the row's generation;
-- p_id taken otherwise is refused. A fork is a sandbox like any other:
-- quotas count it, it idles and is released on its own, and releasing or
-- re-creating its source does not touch it. SECURITY INVOKER: row-level
-- security applies, so a source this role cannot see is not found.
CREATE OR REPLACE FUNCTION sandbox_fork(
    p_source text,
    p_id text,
    p_owner text DEFAULT NULL,
    p_idle_timeout interval DEFAULT NULL,
    p_owner_container text DEFAULT NULL,
    p_attach text[] DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    src          sandbox_desired%ROWTYPE;
    cur          sandbox_desired%ROWTYPE;
    v_generation bigint;
BEGIN
    -- p_id is checked by the validation trigger, as any row's.
    SELECT * INTO src FROM sandbox_desired d WHERE d.id = p_source;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sandbox % to fork from is not found: fork a sandbox this role sees',
            coalesce(sandbox_quote(p_source), 'NULL')
            USING ERRCODE = 'no_data_found';
    END IF;
    IF p_owner IS NOT NULL AND p_owner IS DISTINCT FROM src.owner THEN
        RAISE EXCEPTION 'a fork belongs to its source''s owner, and sandbox % is not %''s: fork it without an owner (NULL)',
            p_source, sandbox_quote(p_owner)
            USING ERRCODE = 'check_violation';
    END IF;
    IF src.expires_at <= now() AND NOT src.persistent THEN
        RAISE EXCEPTION 'sandbox % expired at %: its data is being reaped, so there is nothing to fork', p_source, src.expires_at
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO sandbox_desired AS d
        (id, owner, services, features, attach, idle_timeout, persistent, owner_container,
         requested_at, idle_action, isolation, fork_of, fork_of_incarnation)
    VALUES (p_id, src.owner, src.services, src.features, sandbox_array_union('{}', coalesce(p_attach, '{}')),
            p_idle_timeout, false, p_owner_container, clock_timestamp(),
            'release', src.isolation, src.id, src.incarnation)
    ON CONFLICT (id) DO NOTHING
    RETURNING d.generation INTO v_generation;
    IF FOUND THEN
        RETURN v_generation;
    END IF;
    SELECT * INTO cur FROM sandbox_desired d WHERE d.id = p_id;
    IF FOUND AND cur.fork_of IS NOT DISTINCT FROM src.id
       AND cur.fork_of_incarnation IS NOT DISTINCT FROM src.incarnation THEN
        RETURN cur.generation;
    END IF;
    RAISE EXCEPTION 'sandbox id % is taken: fork into a new id (ids are one namespace for every orchestrator)', p_id
        USING ERRCODE = 'unique_violation';
END
$$;
