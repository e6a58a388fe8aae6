-- pg_notify(p_channel, p_payload) for every trigger and verb of sandboxd,
-- such that no write ever fails because a notification could not be sent
-- (issue 50). Notifications are hints: the controller relists every
-- --relist-interval and a client re-reads on a timer, so a lost one costs
-- latency, never a request.
--
-- Postgres has one notification queue per cluster, shared by every role,
-- and a listener that sits in an open transaction holds every
-- notification sent since it began. Any role may LISTEN and NOTIFY, so a
-- tenant can pin the queue and fill it (8 GB of 8 KB payloads in about
-- 21 s). A full queue fails the transaction that notified at COMMIT
-- ("too many notifications in the NOTIFY queue"), after this function has
-- returned: catching the error here cannot save the write. So this sends
-- nothing once the queue is a quarter full (pg_notification_queue_usage()
-- >= 0.25), far from full, and counts what it skipped in the sequence
-- sandbox_notify_skipped (sandboxd exports it as
-- sandboxd_notify_skipped_total, and the usage as
-- sandboxd_notify_queue_usage). An error of pg_notify itself is caught and
-- counted the same way.
--
-- SECURITY DEFINER: it runs in orchestrators' writes (the triggers run as
-- them), and only the owner may draw from the sequence. Orchestrators may
-- call it directly, which lets them send on sandboxd's channels (as they
-- may with NOTIFY) and count a skip only while the queue is filling
-- anyway; p_channel must be one of sandboxd's.
CREATE OR REPLACE FUNCTION sandbox_notify_send(p_channel text, p_payload text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
BEGIN
    IF p_channel NOT IN ('sandbox_desired', 'sandbox_status', 'sandbox_events') THEN
        RAISE EXCEPTION 'sandbox_notify_send: % is not a channel of sandboxd', p_channel
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_notification_queue_usage() >= 0.25 THEN
        PERFORM nextval('sandbox_notify_skipped');
        RETURN;
    END IF;
    BEGIN
        PERFORM pg_notify(p_channel, p_payload);
    EXCEPTION WHEN OTHERS THEN
        PERFORM nextval('sandbox_notify_skipped');
    END;
END
$$;
