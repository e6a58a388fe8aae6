-- Refuses a status write of a deposed leader (sandbox_lease_fence), except
-- one that only takes credentials away (sandbox_status_forget_credentials,
-- run by a release, when no leader may be there): that is safe from anyone.
CREATE OR REPLACE FUNCTION sandbox_status_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND NEW.services = sandbox_status_without_credentials(OLD.services)
       AND (NEW.phase, NEW.observed_generation, NEW.message, NEW.network, NEW.incarnation,
            NEW.leader_term)
           IS NOT DISTINCT FROM
           (OLD.phase, OLD.observed_generation, OLD.message, OLD.network, OLD.incarnation,
            OLD.leader_term) THEN
        RETURN NEW;
    END IF;
    PERFORM sandbox_lease_fence(NEW.leader_term, 'sandbox_status');
    RETURN NEW;
END
$$;
