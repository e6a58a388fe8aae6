-- For sandbox_checkpoint and sandbox_reset, which run as the tables' owner
-- (SECURITY DEFINER: orchestrators may not write the checkpoint tables or
-- draw request numbers themselves): the owner and incarnation of desired
-- row p_id, locked until the request is written (a release waits for it,
-- and concurrent requests are counted one after the other).
--
-- Refused, as row-level security would, when the calling role may not
-- access the row: the caller is the session's role (SET ROLE's, else the
-- login role), since current_user is the owner here; the owner itself
-- (or a member of it) may. Refused as well when the sandbox has as many
-- checkpoint and reset requests pending as it may
-- (sandbox_checkpoint_settings.max_pending_per_sandbox): sandboxd performs
-- them one after another, and no tenant may queue unbounded work.
-- p_replaces names a checkpoint the request asks for again (its pending
-- request is replaced, not added).
CREATE OR REPLACE FUNCTION sandbox_checkpoint_target(p_id text, p_replaces text,
                                                     OUT row_owner text, OUT row_incarnation uuid)
LANGUAGE plpgsql AS $$
DECLARE
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
    most integer;
    pending integer;
BEGIN
    SELECT d.owner, d.incarnation INTO row_owner, row_incarnation
      FROM sandbox_desired d WHERE d.id = p_id FOR UPDATE;
    IF NOT FOUND OR NOT (pg_has_role(caller, current_user, 'MEMBER')
                         OR sandbox_caller_may_access(row_owner)) THEN
        RAISE EXCEPTION 'there is no sandbox % that this role may see: request it first (sandbox_request)', coalesce(sandbox_quote(p_id), 'NULL')
            USING ERRCODE = 'no_data_found';
    END IF;
    SELECT s.max_pending_per_sandbox INTO most FROM sandbox_checkpoint_settings s;
    most := coalesce(most, 8);
    pending := (SELECT count(*) FROM sandbox_checkpoints c
                WHERE c.sandbox_id = p_id AND c.state = 'requested'
                  AND c.name IS DISTINCT FROM p_replaces)
             + (SELECT count(*) FROM sandbox_resets r
                WHERE r.sandbox_id = p_id AND r.state = 'requested');
    IF pending >= most THEN
        RAISE EXCEPTION 'sandbox % has % checkpoint and reset requests pending, the most a sandbox may have (sandbox_checkpoint_settings.max_pending_per_sandbox = %): wait until sandboxd has performed them (their state in sandbox_checkpoints and sandbox_resets leaves ''requested''), then ask again',
            p_id, pending, most
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
END
$$;
