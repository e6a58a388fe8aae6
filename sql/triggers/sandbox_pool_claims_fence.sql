-- Refuses a claim written by a deposed leader.
CREATE OR REPLACE TRIGGER sandbox_pool_claims_fence
    BEFORE INSERT OR UPDATE ON sandbox_pool_claims
    FOR EACH ROW EXECUTE FUNCTION sandbox_pool_claims_fence();
