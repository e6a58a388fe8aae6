-- Seeds (issue 32): content a sandbox's engine starts with, registered once
-- under its content hash by sandbox_seed_put, and named per engine by a
-- desired row's `seeds`.
--
-- Only additions, named by sql/ inside plpgsql bodies alone (a database
-- adopted from before the baseline gets sql/ applied before this runs).

-- One row per owner and content: a tenant names only the seeds it (or a
-- role that may write its rows) registered, and never reads another's. The
-- same content registered by two owners is stored twice under one hash;
-- sandboxd's templates and pools are shared by hash (the content is the
-- same). Orchestrators reach it only through sandbox_seed_put.
CREATE TABLE sandbox_seeds (
    owner      text        NOT NULL,
    hash       text        NOT NULL CHECK (hash ~ '^sha256:[0-9a-f]{64}$'),
    engine     text        NOT NULL,
    content    bytea       NOT NULL,
    size_bytes integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, hash)
);
CREATE INDEX sandbox_seeds_hash ON sandbox_seeds (hash);

-- The seed a claimed pool container's data started from: its sandbox's
-- containers are seen with it, as if created with the label.
ALTER TABLE sandbox_pool_claims ADD COLUMN seed text NULL;

-- {"engine": "sha256:…"}: the seed each engine starts with (none: empty).
ALTER TABLE sandbox_desired ADD COLUMN seeds jsonb NOT NULL DEFAULT '{}'::jsonb;
