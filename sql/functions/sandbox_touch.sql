-- Records a use: last_used_at = now(), no new generation. False (and
-- nothing changes) when there is no such row this role sees, it has
-- expired (a persistent sandbox never does), or it is being released
-- (status `terminating`): request it again.
--
-- The status it looks at is of the row's incarnation (a status left by an
-- earlier incarnation of the id says nothing about this one).
--
-- Silent (no NOTIFY) unless the row asks to pause and its status is
-- `paused`, or it was idle by the time of the touch (the controller may be
-- pausing it right now; a NULL idle_timeout is the controller's, unknown
-- here, so such rows always notify): then NOTIFY sandbox_desired, so that
-- the controller resumes it at once.
CREATE OR REPLACE FUNCTION sandbox_touch(p_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    before_touch record;
BEGIN
    UPDATE sandbox_desired d SET last_used_at = now()
    FROM (SELECT o.id, o.last_used_at, o.idle_timeout FROM sandbox_desired o
          WHERE o.id = p_id) old
    WHERE d.id = old.id
      AND (d.persistent OR d.expires_at IS NULL OR d.expires_at > now())
      AND NOT EXISTS (SELECT 1 FROM sandbox_status s
                      WHERE s.id = d.id AND s.incarnation = d.incarnation
                        AND s.phase = 'terminating')
    RETURNING d.idle_action, d.incarnation, old.last_used_at, old.idle_timeout INTO before_touch;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF before_touch.idle_action = 'pause'
       AND (before_touch.idle_timeout IS NULL
            OR before_touch.last_used_at + before_touch.idle_timeout <= now() + interval '5 seconds'
            OR EXISTS (SELECT 1 FROM sandbox_status s
                       WHERE s.id = p_id AND s.incarnation = before_touch.incarnation
                         AND s.phase = 'paused')) THEN
        PERFORM sandbox_notify_send('sandbox_desired', before_touch.incarnation::text);
    END IF;
    RETURN true;
END
$$;
