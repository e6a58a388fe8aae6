-- What an orchestrator may use, as one list: sandbox_grant_orchestrator
-- revokes, then grants a role exactly the rows below with a privilege;
-- sandbox_revoke_orchestrator removes every privilege on every object
-- listed, also those listed with privilege NULL (never granted; revoked in
-- case someone granted them by hand). This file is the list: giving
-- orchestrators a new object, or taking one away, is an edit here. Objects
-- are written as GRANT takes them (a function with its argument types); a
-- trigger checks that each exists and normalises its name.
--
-- The list is rewritten whole, then given to the orchestrators registered
-- already (sandbox_apply_orchestrator_privileges adds; a privilege taken
-- off the list leaves a registered role at its next
-- sandbox_grant_orchestrator, or at once if its object was dropped).

COMMENT ON TABLE sandbox_orchestrator_privileges IS
    'What sandbox_grant_orchestrator grants (privilege NULL: never granted, always revoked); written by sandboxd from sql/grants/orchestrator_privileges.sql';

DELETE FROM sandbox_orchestrator_privileges;

-- The schema of sandboxd's tables.
INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege)
SELECT 'schema', n.nspname, 'USAGE'
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = 'sandbox_desired'::regclass;

INSERT INTO sandbox_orchestrator_privileges (object_kind, object, privilege) VALUES
    ('table', 'sandbox_desired', 'SELECT'),
    ('table', 'sandbox_desired', 'INSERT'),
    ('table', 'sandbox_desired', 'UPDATE'),
    ('table', 'sandbox_desired', 'DELETE'),
    ('table', 'sandbox_status', 'SELECT'),
    ('table', 'sandbox_events', 'SELECT'),
    ('table', 'sandbox_engines', 'SELECT'),
    ('table', 'sandbox_engine_features', 'SELECT'),
    -- What the validation triggers and the policies call as the orchestrator
    -- (the policies' predicates judge the caller and take no role).
    ('function', 'sandbox_allowed_engines()', 'EXECUTE'),
    ('function', 'sandbox_allowed_features(text)', 'EXECUTE'),
    ('function', 'sandbox_quote(text)', 'EXECUTE'),
    ('function', 'sandbox_caller_may_access(text)', 'EXECUTE'),
    ('function', 'sandbox_caller_may_see_status(text)', 'EXECUTE'),
    -- The verbs, and what they call.
    ('function', 'sandbox_array_union(text[], text[])', 'EXECUTE'),
    ('function', 'sandbox_features_union(jsonb, jsonb)', 'EXECUTE'),
    ('function', 'sandbox_request(text, text, text[], jsonb, interval, boolean, text, text[], text, text, jsonb)', 'EXECUTE'),
    -- Seeds: registered through the verb only; the validation calls the
    -- lookup as the orchestrator. The table (content) is never theirs.
    ('function', 'sandbox_seed_put(text, bytea, text)', 'EXECUTE'),
    ('function', 'sandbox_seed_delete(text, text)', 'EXECUTE'),
    ('function', 'sandbox_seed_engine(text, text)', 'EXECUTE'),
    -- Forks: the verb inserts the row as the orchestrator (the
    -- validation checks the source as the orchestrator too).
    ('function', 'sandbox_fork(text, text, text, interval, text, text[])', 'EXECUTE'),
    ('function', 'sandbox_touch(text)', 'EXECUTE'),
    ('function', 'sandbox_release(text)', 'EXECUTE'),
    -- Checkpoints: the verbs, and reading what they wrote. Only the verbs
    -- (SECURITY DEFINER) write the tables and draw request numbers: a
    -- tenant that could would take numbers ahead of others' requests and
    -- queue unbounded work.
    ('table', 'sandbox_checkpoints', 'SELECT'),
    ('table', 'sandbox_resets', 'SELECT'),
    ('function', 'sandbox_checkpoint(text, text)', 'EXECUTE'),
    ('function', 'sandbox_reset(text, text)', 'EXECUTE'),
    -- What the triggers and verbs notify through, as the orchestrator (it
    -- runs as the owner: see the function).
    ('function', 'sandbox_notify_send(text, text)', 'EXECUTE'),
    -- Never granted; revoked in case someone granted them by hand.
    ('sequence', 'sandbox_checkpoint_requests', NULL),
    ('function', 'sandbox_checkpoint_target(text, text)', NULL),
    ('function', 'sandbox_status_credentials()', NULL),
    ('function', 'sandbox_status_forget_credentials()', NULL),
    ('table', 'sandbox_orchestrators', NULL),
    ('table', 'sandbox_checkpoint_settings', NULL),
    ('table', 'sandbox_orchestrator_privileges', NULL),
    ('function', 'sandbox_desired_validate()', NULL),
    ('function', 'sandbox_desired_validate_lifecycle()', NULL),
    ('function', 'sandbox_desired_validate_idle_action()', NULL),
    ('function', 'sandbox_notify()', NULL),
    ('function', 'sandbox_grant_orchestrator(name, boolean)', NULL),
    ('function', 'sandbox_revoke_orchestrator(name)', NULL),
    ('function', 'sandbox_record_events(bigint, text, uuid, text, jsonb, integer)', NULL),
    ('function', 'sandbox_checkpoints_validate()', NULL),
    ('function', 'sandbox_checkpoints_forget()', NULL),
    ('function', 'sandbox_apply_orchestrator_privileges(name)', NULL),
    ('function', 'sandbox_orchestrator_privileges_validate()', NULL);

SELECT sandbox_apply_orchestrator_privileges(o.role) FROM sandbox_orchestrators o
WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = o.role);
