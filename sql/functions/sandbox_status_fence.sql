-- Refuses a status write of a deposed leader (sandbox_lease_fence).
CREATE OR REPLACE FUNCTION sandbox_status_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sandbox_lease_fence(NEW.leader_term, 'sandbox_status');
    RETURN NEW;
END
$$;
