-- A status's `services` without its credentials: each engine's `password`,
-- `url` and `env` (which repeat the password) emptied; host, ports, user
-- and the rest kept. Anything that is not an object of objects is left as
-- it is (sandboxd's parser refuses it). The one definition of what a
-- status's credentials are: the status triggers and sandboxd's redacted
-- reads use it.
CREATE OR REPLACE FUNCTION sandbox_status_without_credentials(services jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(services) = 'object' THEN
        coalesce((SELECT jsonb_object_agg(e.engine, CASE WHEN jsonb_typeof(e.entry) = 'object'
                      THEN e.entry || '{"password": "", "url": "", "env": {}}'::jsonb
                      ELSE e.entry END)
                  FROM jsonb_each(services) AS e(engine, entry)), '{}'::jsonb)
        ELSE services END
$$;
