-- Every row names an object that exists, of its kind, in the form GRANT
-- takes and pg_catalog prints (so one object is one name).
CREATE OR REPLACE FUNCTION sandbox_orchestrator_privileges_validate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rel regclass;
    kind "char";
BEGIN
    IF NEW.object_kind = 'function' THEN
        IF to_regprocedure(NEW.object) IS NULL THEN
            RAISE EXCEPTION 'orchestrator privilege on function %: there is no such function; write its name with its argument types, e.g. sandbox_touch(text)',
                sandbox_quote(NEW.object)
                USING ERRCODE = 'undefined_function';
        END IF;
        NEW.object := to_regprocedure(NEW.object)::text;
    ELSIF NEW.object_kind = 'schema' THEN
        IF to_regnamespace(NEW.object) IS NULL THEN
            RAISE EXCEPTION 'orchestrator privilege on schema %: there is no such schema', sandbox_quote(NEW.object)
                USING ERRCODE = 'invalid_schema_name';
        END IF;
        NEW.object := to_regnamespace(NEW.object)::text;
    ELSE
        rel := to_regclass(NEW.object);
        SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = rel;
        IF rel IS NULL OR (NEW.object_kind = 'sequence') <> (kind = 'S')
           OR kind NOT IN ('r', 'p', 'v', 'S') THEN
            RAISE EXCEPTION 'orchestrator privilege on % %: there is no such %', NEW.object_kind,
                sandbox_quote(NEW.object), NEW.object_kind
                USING ERRCODE = 'undefined_table';
        END IF;
        NEW.object := rel::text;
    END IF;
    RETURN NEW;
END
$$;
