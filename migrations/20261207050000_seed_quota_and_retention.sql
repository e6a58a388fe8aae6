-- Seeds had no per-owner limit and nothing deleted them: one tenant put
-- eight 16 MiB seeds in nine seconds (+132 MiB in the state database) and
-- they stayed for good (issue 50).
--
-- An owner's seeds are now limited, in number and in bytes, by two more
-- columns of its quota row (or the default row '*'); NULL is unlimited, as
-- for the other limits. Rows written before this get the defaults, as do
-- new rows that do not say, and an owner no row applies to
-- (sandbox_quota_for): 16 seeds, 64 MiB together. sandbox_seed_put
-- refuses a seed that would go over.
ALTER TABLE sandbox_quotas
    ADD COLUMN max_seeds      integer NULL DEFAULT 16 CHECK (max_seeds >= 0),
    ADD COLUMN max_seed_bytes bigint  NULL DEFAULT 67108864 CHECK (max_seed_bytes >= 0);

COMMENT ON TABLE sandbox_quotas IS
    'Per-owner limits on admitted sandboxes, the sum of their memory caps, and the seeds the owner stores (count and bytes); owner ''*'' is the default, an owner''s row replaces it, NULL is unlimited; written by the operator (sandboxd quota set)';

-- When a desired row last named the seed (or it was put): the trigger
-- sandbox_desired_seeds_named keeps it. The leader deletes a seed that no
-- row names and none named for --seed-retention. Seeds stored before this
-- start their window now.
ALTER TABLE sandbox_seeds ADD COLUMN last_named_at timestamptz NOT NULL DEFAULT now();
