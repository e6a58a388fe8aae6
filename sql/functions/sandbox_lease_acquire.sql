-- Takes the lease for p_holder if nobody holds it or the holder's lease has
-- expired: the term grows by one. Returns the new term, or NULL when
-- another holder's lease is still valid.
CREATE OR REPLACE FUNCTION sandbox_lease_acquire(p_holder text, p_duration_ms bigint)
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    INSERT INTO sandbox_leader AS l (singleton, holder, term, acquired_at, renewed_at, expires_at)
    VALUES (true, p_holder, 1, now(), now(), now() + p_duration_ms * interval '1 millisecond')
    ON CONFLICT (singleton) DO UPDATE
        SET holder = EXCLUDED.holder,
            term = l.term + 1,
            acquired_at = now(),
            renewed_at = now(),
            expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= now()
    RETURNING term
$$;
