-- Gives the lease up at once (a clean shutdown), so a standby need not
-- wait for it to expire. The term stays: the next holder's is one more.
CREATE OR REPLACE FUNCTION sandbox_lease_release(p_holder text, p_term bigint)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE sandbox_leader SET expires_at = now()
     WHERE holder = p_holder AND term = p_term AND expires_at > now()
$$;
