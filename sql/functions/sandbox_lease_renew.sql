-- Extends p_holder's lease of term p_term. Returns false when that lease
-- is no longer this holder's or has expired (it must not be extended then:
-- another process may have taken it).
CREATE OR REPLACE FUNCTION sandbox_lease_renew(p_holder text, p_term bigint, p_duration_ms bigint)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH renewed AS (
        UPDATE sandbox_leader
           SET renewed_at = now(),
               expires_at = now() + p_duration_ms * interval '1 millisecond'
         WHERE holder = p_holder AND term = p_term AND expires_at > now()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM renewed)
$$;
