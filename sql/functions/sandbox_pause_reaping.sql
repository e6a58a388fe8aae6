-- Pauses reaping with p_reason (kept from the first trip while paused):
-- the reaping circuit breaker tripped. The pause outlives a restart.
CREATE OR REPLACE FUNCTION sandbox_pause_reaping(p_reason text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE sandbox_reaping SET paused = true, reason = p_reason, paused_at = now()
     WHERE NOT paused
$$;
