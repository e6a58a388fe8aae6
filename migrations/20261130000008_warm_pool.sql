-- sandboxd: claims of warm-pool containers.
--
-- A warm-pool container is created ahead of any request, so its Docker
-- labels name no sandbox (and labels cannot change). When a new sandbox
-- (or a heal) claims one, the controller records here, BEFORE it touches
-- the container, which sandbox the container now serves: its sandbox id,
-- engine, the row's generation, incarnation and owner, the features and
-- the new instance token. The status carries that token only once the
-- claim finished, so a claim a crash interrupted maps the container to
-- its sandbox with an instance that was never published, and the normal
-- path replaces it. A restarted controller (or a new leader) reads the
-- claims back to see claimed containers as the sandbox's.
--
-- Writes carry the writer's leader term and are fenced like
-- sandbox_status (migration 06). Only sandboxd's role (the owner) reads
-- or writes it: the orchestrator role gets nothing.

CREATE TABLE sandbox_pool_claims (
    container   text PRIMARY KEY CHECK (length(container) BETWEEN 1 AND 128),
    sandbox_id  text NOT NULL,
    engine      text NOT NULL,
    generation  bigint NOT NULL,
    incarnation text NULL,
    owner       text NOT NULL DEFAULT '',
    features    text[] NOT NULL DEFAULT '{}',
    instance    text NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    leader_term bigint NULL
);

CREATE INDEX sandbox_pool_claims_sandbox ON sandbox_pool_claims (sandbox_id);

COMMENT ON TABLE sandbox_pool_claims IS
    'Warm-pool containers claimed by a sandbox (container id -> sandbox): Docker labels cannot change, so the claim lives here; written only by the sandboxd leader';

CREATE FUNCTION sandbox_pool_claims_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.leader_term IS NULL OR NOT sandbox_lease_valid(NEW.leader_term) THEN
        RAISE EXCEPTION 'sandbox_pool_claims write refused: leader term % is not the current leader''s',
                        coalesce(NEW.leader_term::text, 'NULL')
            USING ERRCODE = 'SX001',
                  HINT = 'another sandboxd holds the lease (SELECT * FROM sandbox_leader); this write came from a deposed leader';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sandbox_pool_claims_fence
    BEFORE INSERT OR UPDATE ON sandbox_pool_claims
    FOR EACH ROW EXECUTE FUNCTION sandbox_pool_claims_fence();

REVOKE ALL ON TABLE sandbox_pool_claims FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION sandbox_pool_claims_fence() FROM PUBLIC;

DO $$
DECLARE
    schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.oid = 'sandbox_desired'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION sandbox_pool_claims_fence() SET search_path = pg_catalog, %I, pg_temp', schema_name);
END
$$;
