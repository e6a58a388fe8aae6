-- sandboxd: one leader per state database.
--
-- Several `sandboxd run` processes may share a state database (and so a
-- deployment). One of them leads: it holds the lease below, a single row
-- with the holder, a term and an expiry on the database's clock. The
-- leader renews it on a short interval with one statement; the others
-- stand by and take it over once it has expired. Every step is a single
-- statement, so the lease works behind a transaction pooler (no session
-- state, no advisory lock).
--
-- The term is a fencing token. It grows by one at every acquisition, and
-- every write of sandbox_status carries the writer's term in leader_term:
-- the trigger below refuses a write whose term is not the current,
-- unexpired lease's, so a deposed leader's late write never lands. (The
-- leader itself stops writing, and stops changing Docker, earlier: by its
-- own clock, a safety margin before the lease it last renewed can expire.)
--
-- Unqualified names resolve to the tables' schema, as in the earlier
-- migrations; the DO block at the end pins the functions' search_path.

CREATE TABLE sandbox_leader (
    -- One row at most.
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    holder      text NOT NULL CHECK (length(holder) BETWEEN 1 AND 200),
    term        bigint NOT NULL CHECK (term > 0),
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

COMMENT ON TABLE sandbox_leader IS
    'The sandboxd leader lease: holder, term (a fencing token) and expiry; written only through sandbox_lease_* by sandboxd';

-- Takes the lease for p_holder if nobody holds it or the holder's lease has
-- expired: the term grows by one. Returns the new term, or NULL when
-- another holder's lease is still valid.
CREATE FUNCTION sandbox_lease_acquire(p_holder text, p_duration_ms bigint)
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

-- Extends p_holder's lease of term p_term. Returns false when that lease
-- is no longer this holder's or has expired (it must not be extended then:
-- another process may have taken it).
CREATE FUNCTION sandbox_lease_renew(p_holder text, p_term bigint, p_duration_ms bigint)
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

-- Gives the lease up at once (a clean shutdown), so a standby need not
-- wait for it to expire. The term stays: the next holder's is one more.
CREATE FUNCTION sandbox_lease_release(p_holder text, p_term bigint)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE sandbox_leader SET expires_at = now()
     WHERE holder = p_holder AND term = p_term AND expires_at > now()
$$;

-- Whether p_term is the current leader's term and its lease is valid.
CREATE FUNCTION sandbox_lease_valid(p_term bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM sandbox_leader WHERE term = p_term AND expires_at > now())
$$;

-- Every status write carries its writer's term.
ALTER TABLE sandbox_status ADD COLUMN leader_term bigint NULL;

CREATE FUNCTION sandbox_status_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.leader_term IS NULL OR NOT sandbox_lease_valid(NEW.leader_term) THEN
        RAISE EXCEPTION 'sandbox_status write refused: leader term % is not the current leader''s',
                        coalesce(NEW.leader_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_status_fence
    BEFORE INSERT OR UPDATE ON sandbox_status
    FOR EACH ROW EXECUTE FUNCTION sandbox_status_fence();

-- Only the owner (sandboxd's role) uses these.
REVOKE EXECUTE ON FUNCTION sandbox_lease_acquire(text, bigint),
                           sandbox_lease_renew(text, bigint, bigint),
                           sandbox_lease_release(text, bigint),
                           sandbox_lease_valid(bigint),
                           sandbox_status_fence()
    FROM PUBLIC;

DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sandbox_lease_acquire(text, bigint) SET search_path = pg_catalog, %I, pg_temp', schema_name);
    EXECUTE format('ALTER FUNCTION sandbox_lease_renew(text, bigint, bigint) SET search_path = pg_catalog, %I, pg_temp', schema_name);
    EXECUTE format('ALTER FUNCTION sandbox_lease_release(text, bigint) SET search_path = pg_catalog, %I, pg_temp', schema_name);
    EXECUTE format('ALTER FUNCTION sandbox_lease_valid(bigint) SET search_path = pg_catalog, %I, pg_temp', schema_name);
    EXECUTE format('ALTER FUNCTION sandbox_status_fence() SET search_path = pg_catalog, %I, pg_temp', schema_name);
END
$$;
