-- Whether p_term is the current leader's term and its lease is valid.
CREATE OR REPLACE FUNCTION sandbox_lease_valid(p_term bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM sandbox_leader WHERE term = p_term AND expires_at > now())
$$;
