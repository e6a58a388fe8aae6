-- sandboxd: which state database, and which incarnation of a row.
--
-- * sandbox_identity holds one random uuid, created here: the identity of
--   this state database. The controller labels every container, network
--   and volume it creates with it (io.sandboxd.state-id) and never tears
--   down, heals, rotates or removes one that carries another identity (a
--   controller of the same deployment pointed at another database, e.g. an
--   empty one). A dump restored elsewhere keeps it: it is the same state.
--   The row cannot be changed or deleted.
-- * sandbox_desired.incarnation: a random uuid per row, set by the
--   database on insert and kept on every update (whatever a client writes
--   there is ignored), so a row deleted and inserted again is another
--   incarnation. The controller labels the row's containers and data
--   volumes with it and writes it to sandbox_status.incarnation; a client
--   waiting for its row accepts only a status of its incarnation.
--
-- Unqualified names resolve to the tables' schema, as in the earlier
-- migrations; the DO block at the end pins the new functions' search_path.

CREATE TABLE sandbox_identity (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    state_id   uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO sandbox_identity DEFAULT VALUES;

CREATE FUNCTION sandbox_identity_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the identity of this state database cannot change: sandboxd labels its containers with it and leaves those of any other identity alone; to start afresh, create a new database (sandboxd migrate gives it a new identity)'
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER sandbox_identity_immutable
    BEFORE UPDATE OR DELETE ON sandbox_identity
    FOR EACH ROW EXECUTE FUNCTION sandbox_identity_immutable();
CREATE TRIGGER sandbox_identity_no_truncate
    BEFORE TRUNCATE ON sandbox_identity
    FOR EACH STATEMENT EXECUTE FUNCTION sandbox_identity_immutable();

-- Existing rows each get a random incarnation of their own (a volatile
-- default is evaluated per row), and their statuses the row's.
ALTER TABLE sandbox_desired
    ADD COLUMN incarnation uuid NOT NULL DEFAULT gen_random_uuid(),
    ADD CONSTRAINT sandbox_desired_incarnation_key UNIQUE (incarnation);
ALTER TABLE sandbox_status ADD COLUMN incarnation uuid NULL;
UPDATE sandbox_status s SET incarnation = d.incarnation
FROM sandbox_desired d WHERE d.id = s.id;

-- Owns `incarnation`: a new one on every insert (also the insert an
-- `INSERT … ON CONFLICT DO UPDATE` turns into an update, which then keeps
-- the existing row's), the old one on every update.
CREATE FUNCTION sandbox_desired_incarnation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.incarnation := gen_random_uuid();
    ELSE
        NEW.incarnation := OLD.incarnation;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_desired_incarnation
    BEFORE INSERT OR UPDATE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_incarnation();

-- Trigger functions run without an EXECUTE check: nobody needs to call them.
REVOKE EXECUTE ON FUNCTION sandbox_identity_immutable(), sandbox_desired_incarnation() FROM PUBLIC;

-- Pin the new functions' search_path to the tables' schema, pg_temp last.
DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        'sandbox_identity_immutable()', 'sandbox_desired_incarnation()'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, schema_name);
    END LOOP;
END
$$;
