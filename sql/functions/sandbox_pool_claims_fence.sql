-- Refuses a pool claim written by a deposed leader (sandbox_lease_fence).
CREATE OR REPLACE FUNCTION sandbox_pool_claims_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sandbox_lease_fence(NEW.leader_term, 'sandbox_pool_claims');
    RETURN NEW;
END
$$;
