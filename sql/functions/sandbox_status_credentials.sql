-- A status holds credentials only while it describes the current
-- incarnation of its desired row. Any other write is stripped of them
-- (sandbox_status_without_credentials): a status for a deleted row, for an
-- earlier incarnation of its id, or of no incarnation. So a controller's
-- late write (it read the row just before an orchestrator released it)
-- cannot bring back what the release cleared.
--
-- The row is read FOR KEY SHARE: a release running now (its DELETE holds
-- the row) is waited for and then seen, and one that comes later waits
-- for this write and then clears it (sandbox_status_forget_credentials).
-- A write without credentials takes no lock.
CREATE OR REPLACE FUNCTION sandbox_status_credentials() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bare jsonb := sandbox_status_without_credentials(NEW.services);
BEGIN
    IF NEW.services IS NOT DISTINCT FROM bare THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM sandbox_desired d
     WHERE d.id = NEW.id AND d.incarnation = NEW.incarnation
       FOR KEY SHARE;
    IF NOT FOUND THEN
        NEW.services := bare;
    END IF;
    RETURN NEW;
END
$$;
