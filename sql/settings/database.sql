-- Every session of the state database starts with these bounds (issue 50),
-- an orchestrator's included:
--
-- - idle_in_transaction_session_timeout = 60s: a session left idle in an
--   open transaction holds, among other things, every notification sent
--   since (the NOTIFY queue is the whole cluster's), and row locks. An
--   orchestrator's calls are single statements; none waits in a
--   transaction.
-- - statement_timeout = 30s: the largest thing an orchestrator sends, a
--   16 MiB seed, takes well under a second.
--
-- These are defaults (ALTER DATABASE … SET), which Postgres lets any
-- session change for itself (SET statement_timeout = 0): they stop an
-- orchestrator's forgotten transaction, not a hostile one. What no tenant
-- can defeat is sandbox_notify_send, which stops notifying before the
-- queue can fill. sandboxd's own sessions set their statement_timeout
-- from --store-timeout. An operator changes them for one role with
-- ALTER ROLE … IN DATABASE … SET (a role's setting wins over these).
--
-- Only the database's owner (or a superuser) may set them: a controller
-- that is neither says so and goes on.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_database d
               WHERE d.datname = current_database()
                 AND (pg_has_role(current_user, d.datdba, 'USAGE')
                      OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user))) THEN
        EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L',
                       current_database(), '60s');
        EXECUTE format('ALTER DATABASE %I SET statement_timeout = %L',
                       current_database(), '30s');
    ELSE
        RAISE WARNING 'sandboxd does not own database %, so its sessions get no idle_in_transaction_session_timeout or statement_timeout from it: as its owner, ALTER DATABASE % SET idle_in_transaction_session_timeout = ''60s''; ALTER DATABASE % SET statement_timeout = ''30s''',
            quote_ident(current_database()), quote_ident(current_database()), quote_ident(current_database());
    END IF;
END
$$;
