-- Forks (issue 32): a sandbox whose engines start with a copy of another
-- sandbox's data (sandbox_fork). The source is named by id and
-- incarnation, both fixed at insert: a source released and requested
-- again is another sandbox, whose data the fork never copies.
--
-- Only additions, named by sql/ inside plpgsql bodies alone (a database
-- adopted from before the baseline gets sql/ applied before this runs).
ALTER TABLE sandbox_desired
    ADD COLUMN fork_of text NULL,
    ADD COLUMN fork_of_incarnation uuid NULL;
