-- Records p_events (a JSON array of {"reason","engine","detail","message"})
-- for sandbox p_sandbox as the leader of p_term, then keeps only the
-- newest p_keep events of the sandbox id that are p_owner's. Refused
-- (SQLSTATE SX001) when p_term is not the current, unexpired lease's.
--
-- Kept per owner: an id is reused, and the next holder of a released id
-- never prunes the last one's events (issue 50), which stay until they
-- age out (sandboxd deletes events older than its --event-retention).
-- An owner releasing and requesting the id again and again prunes its own
-- older incarnations', so an id holds at most p_keep events per owner.
--
-- Never a credential: every password the sandbox's status holds is replaced
-- with *** before a message is stored. An event equal to the sandbox's
-- latest one (same incarnation, reason, engine, detail and message) bumps
-- its count and last_at instead of adding a row; an event of another owner
-- never does (a row is visible to its owner: it never changes hands).
--
-- Each event written is announced on NOTIFY sandbox_events, in the same
-- transaction (a refused or rolled-back write announces nothing). Any role
-- that may connect can LISTEN there, so the payload holds only what every
-- role may know: seq, incarnation (a random uuid that names no id and
-- opens nothing: see sandbox_notify), reason, engine, count, first_at,
-- last_at; never the sandbox id (released ids stay unknown to other
-- tenants), the owner, the message or the detail (a fork's source id, a
-- seed's hash, a checkpoint's name: issue 50). A listener reads those
-- from sandbox_events by seq, under row-level security. The send is
-- sandbox_notify_send's: skipped, never failing the write, while the
-- queue fills. The function returns the events as full notices (payload
-- plus sandbox_id, owner, detail and message) for sandboxd's webhook.
CREATE OR REPLACE FUNCTION sandbox_record_events(p_term bigint, p_sandbox text, p_incarnation uuid,
                                      p_owner text, p_events jsonb, p_keep integer)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ev      jsonb;
    msg     text;
    secret  text;
    latest  sandbox_events%ROWTYPE;
    written sandbox_events%ROWTYPE;
    notice  jsonb;
    notices jsonb := '[]'::jsonb;
    cutoff  bigint;
BEGIN
    PERFORM sandbox_lease_fence(p_term, 'sandbox_events');
    IF p_keep IS NULL OR p_keep < 1 THEN
        RAISE EXCEPTION 'sandbox_record_events: keep at least one event per sandbox (got %)', p_keep
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_events) <> 'array' THEN
        RAISE EXCEPTION 'sandbox_record_events: events must be a JSON array'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR ev IN SELECT value FROM jsonb_array_elements(p_events) LOOP
        msg := coalesce(ev->>'message', '');
        FOR secret IN
            SELECT e.value->>'password' FROM sandbox_status s, jsonb_each(s.services) e
             WHERE s.id = p_sandbox AND jsonb_typeof(e.value) = 'object'
               AND length(e.value->>'password') > 0
        LOOP
            msg := replace(msg, secret, '***');
        END LOOP;
        msg := left(msg, 1000);
        SELECT * INTO latest FROM sandbox_events
         WHERE sandbox_id = p_sandbox ORDER BY seq DESC LIMIT 1;
        IF FOUND
           AND latest.incarnation IS NOT DISTINCT FROM p_incarnation
           AND latest.owner = coalesce(p_owner, '')
           AND latest.reason = ev->>'reason'
           AND latest.engine IS NOT DISTINCT FROM ev->>'engine'
           AND latest.detail IS NOT DISTINCT FROM ev->>'detail'
           AND latest.message = msg THEN
            UPDATE sandbox_events
               SET count = least(count, 2147483646) + 1, last_at = now(), leader_term = p_term
             WHERE seq = latest.seq
            RETURNING * INTO written;
        ELSE
            INSERT INTO sandbox_events (sandbox_id, incarnation, owner, reason, engine, detail,
                                        message, leader_term)
            VALUES (p_sandbox, p_incarnation, coalesce(p_owner, ''), ev->>'reason', ev->>'engine',
                    left(ev->>'detail', 64), msg, p_term)
            RETURNING * INTO written;
        END IF;
        -- What every role may know (see above); times in UTC, RFC 3339.
        notice := jsonb_build_object(
            'seq', written.seq,
            'incarnation', written.incarnation,
            'reason', written.reason,
            'engine', written.engine,
            'count', written.count,
            'first_at', to_char(written.first_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'last_at', to_char(written.last_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
        PERFORM sandbox_notify_send('sandbox_events', notice::text);
        notices := notices || jsonb_build_array(notice || jsonb_build_object(
            'sandbox_id', written.sandbox_id,
            'owner', written.owner,
            'detail', written.detail,
            'message', written.message));
    END LOOP;
    SELECT seq INTO cutoff FROM sandbox_events
     WHERE sandbox_id = p_sandbox AND owner = coalesce(p_owner, '')
     ORDER BY seq DESC OFFSET p_keep - 1 LIMIT 1;
    IF cutoff IS NOT NULL THEN
        DELETE FROM sandbox_events
         WHERE sandbox_id = p_sandbox AND owner = coalesce(p_owner, '') AND seq < cutoff;
    END IF;
    RETURN notices;
END
$$;

COMMENT ON FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer) IS
    'Records events as the leader of p_term (SQLSTATE SX001 otherwise), announces each on NOTIFY sandbox_events (seq, incarnation, reason, engine, count, first_at, last_at: no sandbox id, owner, detail, message or credential; skipped while the queue fills) and returns them in full for the webhook';
