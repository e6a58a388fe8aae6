-- The owner's alone.
REVOKE ALL ON TABLE sandbox_checkpoint_settings FROM PUBLIC;
