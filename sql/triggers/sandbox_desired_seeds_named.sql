-- A row that names or stops naming a seed marks it named now. On every
-- update (the function returns at once when owner and seeds are
-- unchanged): a column list would name `seeds`, which a database adopted
-- from before the baseline does not have yet when sql/ is applied.
CREATE OR REPLACE TRIGGER sandbox_desired_seeds_named
    AFTER INSERT OR UPDATE OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_seeds_named();
