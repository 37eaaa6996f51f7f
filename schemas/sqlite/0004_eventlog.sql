-- The embedded event log: dense offsets per partition, records as the codec wrote them.
-- IF NOT EXISTS because files written before this migration existed already hold these tables
-- (the log created them itself); this migration then only records them in the ledger.
-- onward_log_meta keeps the partition count the file was created with.
CREATE TABLE IF NOT EXISTS onward_log_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS onward_log_partition (
    partition INTEGER PRIMARY KEY,
    start_offset INTEGER NOT NULL,
    next_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS onward_log (
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (partition, offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS onward_log_by_run ON onward_log (run_id, partition, offset);
