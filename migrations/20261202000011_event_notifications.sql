-- sandboxd: every event is also announced, as it is recorded.
--
-- * sandbox_record_events (migration 09) now sends, for each event it
--   writes, `NOTIFY sandbox_events` with a JSON payload, in the same
--   transaction as the write (a refused or rolled-back write announces
--   nothing), so every writer of events is covered. A repeated event that
--   is counted into the sandbox's latest row is announced again, with its
--   new count and last_at (same seq).
-- * The channel cannot be restricted: any role that may connect can
--   LISTEN on it, an own-rows-only orchestrator included. So its payload
--   holds only what every role may know: seq, sandbox_id (the ids are
--   already on LISTEN sandbox_status), reason, engine, detail (fixed
--   words written by sandboxd), count, first_at, last_at. Never the owner,
--   the incarnation or the message (free text about the sandbox): a
--   listener reads those from sandbox_events by seq, where row-level
--   security shows it only the events it may read. Never a credential
--   (messages are scrubbed before they are stored, and are not sent).
--   The payload is a few hundred bytes (NOTIFY's limit is 8000).
-- * The function returns the recorded events as a JSON array of full
--   notices (the payload plus owner, incarnation and message), which
--   sandboxd sends to its webhook (--webhook-url): that receiver is the
--   deployment's own, not an orchestrator's.
--
-- The return type changes (void -> jsonb), so the function is dropped and
-- created again; its body is migration 09's plus the notices.

DROP FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer);

CREATE FUNCTION sandbox_record_events(p_term bigint, p_sandbox text, p_incarnation uuid,
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
    IF p_term IS NULL OR NOT sandbox_lease_valid(p_term) THEN
        RAISE EXCEPTION 'sandbox_events write refused: leader term % is not the current leader''s',
                        coalesce(p_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
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
           AND latest.reason = ev->>'reason'
           AND latest.engine IS NOT DISTINCT FROM ev->>'engine'
           AND latest.detail IS NOT DISTINCT FROM ev->>'detail'
           AND latest.message = msg THEN
            UPDATE sandbox_events
               SET count = least(count, 2147483646) + 1, last_at = now(), leader_term = p_term,
                   owner = coalesce(p_owner, '')
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
            'sandbox_id', written.sandbox_id,
            'reason', written.reason,
            'engine', written.engine,
            'detail', written.detail,
            'count', written.count,
            'first_at', to_char(written.first_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'last_at', to_char(written.last_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
        PERFORM pg_notify('sandbox_events', notice::text);
        notices := notices || jsonb_build_array(notice || jsonb_build_object(
            'owner', written.owner,
            'incarnation', written.incarnation,
            'message', written.message));
    END LOOP;
    SELECT seq INTO cutoff FROM sandbox_events
     WHERE sandbox_id = p_sandbox ORDER BY seq DESC OFFSET p_keep - 1 LIMIT 1;
    IF cutoff IS NOT NULL THEN
        DELETE FROM sandbox_events WHERE sandbox_id = p_sandbox AND seq < cutoff;
    END IF;
    RETURN notices;
END
$$;

COMMENT ON FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer) IS
    'Records events as the leader of p_term (SQLSTATE SX001 otherwise), announces each on NOTIFY sandbox_events (seq, sandbox_id, reason, engine, detail, count, first_at, last_at: no owner, message or credential) and returns them in full for the webhook';

REVOKE EXECUTE ON FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer) FROM PUBLIC;

DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sandbox_record_events(bigint, text, uuid, text, jsonb, integer) '
                   'SET search_path = pg_catalog, %I, pg_temp', schema_name);
END
$$;
