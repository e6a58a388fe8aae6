-- Owns `incarnation`: a new one on every insert (also the insert an
-- `INSERT … ON CONFLICT DO UPDATE` turns into an update, which then keeps
-- the existing row's), the old one on every update.
CREATE OR REPLACE FUNCTION sandbox_desired_incarnation() RETURNS trigger
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
