-- A row that names or stops naming a seed marks it named now.
CREATE OR REPLACE TRIGGER sandbox_desired_seeds_named
    AFTER INSERT OR UPDATE OF owner, seeds OR DELETE ON sandbox_desired
    FOR EACH ROW EXECUTE FUNCTION sandbox_desired_seeds_named();
