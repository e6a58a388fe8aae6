-- A deleted desired row's status loses its credentials in the deleting
-- transaction, before any controller acts (or when none leads): another
-- tenant that takes the released id, or a reader of the status table,
-- never finds them. The status row itself stays for sandboxd (it tears
-- the sandbox down and then deletes it). SECURITY DEFINER: orchestrators
-- delete rows, and may not write statuses.
CREATE OR REPLACE FUNCTION sandbox_status_forget_credentials() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    UPDATE sandbox_status s SET services = sandbox_status_without_credentials(s.services)
     WHERE s.id = OLD.id
       AND s.services IS DISTINCT FROM sandbox_status_without_credentials(s.services);
    RETURN NULL;
END
$$;
