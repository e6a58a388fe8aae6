-- Only sandboxd's role (the owner) reads or writes the pool's claims.
REVOKE ALL ON TABLE sandbox_pool_claims FROM PUBLIC;
