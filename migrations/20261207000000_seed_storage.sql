-- Seeds are read a chunk at a time (substring of the content), never
-- whole: stored out of line and uncompressed, a chunk is read from the
-- pages that hold it, not by decompressing everything before it. Rows
-- stored before keep their compression and are still read correctly,
-- only more slowly.
ALTER TABLE sandbox_seeds ALTER COLUMN content SET STORAGE EXTERNAL;
