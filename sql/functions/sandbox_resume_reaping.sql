-- Resumes reaping (`sandboxd resume-reaping`); returns whether it was
-- paused, why and since when, and wakes the controller (NOTIFY '*', with
-- sandbox_relist_requests moved: relist).
CREATE OR REPLACE FUNCTION sandbox_resume_reaping()
RETURNS TABLE (was_paused boolean, reason text, paused_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    previous sandbox_reaping%ROWTYPE;
BEGIN
    SELECT * INTO previous FROM sandbox_reaping FOR UPDATE;
    UPDATE sandbox_reaping
       SET paused = false, resumed_at = now(), resumed_by = session_user
     WHERE paused;
    PERFORM nextval('sandbox_relist_requests');
    PERFORM sandbox_notify_send('sandbox_desired', '*');
    RETURN QUERY SELECT coalesce(previous.paused, false), coalesce(previous.reason, ''), previous.paused_at;
END
$$;
