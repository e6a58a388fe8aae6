-- Notifications skipped because the cluster's NOTIFY queue was filling
-- (a quarter full or more) or pg_notify failed: drawn by
-- sandbox_notify_send (sql/functions/), read by sandboxd as
-- sandboxd_notify_skipped_total. A sequence, not a row: drawing it takes
-- no lock, so writes that skip their notification never queue on each
-- other, and a rolled-back write's skip still counts. A new sequence
-- grants PUBLIC nothing.
CREATE SEQUENCE sandbox_notify_skipped;
