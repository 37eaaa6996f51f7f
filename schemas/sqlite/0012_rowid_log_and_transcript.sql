-- The log's records and the transcript's messages move to rowid tables. A WITHOUT ROWID table
-- keeps at most about 1,000 bytes of a row in its 4 KB leaf page and spills the rest into an
-- overflow page of its own, so every record or message a little over 1 KB (a tool result of
-- 1 KB) cost a whole extra page; a rowid table keeps rows up to about 4,000 bytes in the leaf.
-- The keys stay unique through the primary key's index; the queries are unchanged.
CREATE TABLE onward_log_rows (
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (partition, offset)
);
INSERT INTO onward_log_rows (partition, offset, run_id, record)
    SELECT partition, offset, run_id, record FROM onward_log ORDER BY partition, offset;
DROP TABLE onward_log;
ALTER TABLE onward_log_rows RENAME TO onward_log;
CREATE INDEX onward_log_by_run ON onward_log (run_id, partition, offset);

CREATE TABLE onward_transcript_rows (
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message BLOB NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
);
INSERT INTO onward_transcript_rows (tenant, run_id, seq, message)
    SELECT tenant, run_id, seq, message FROM onward_transcript ORDER BY tenant, run_id, seq;
DROP TABLE onward_transcript;
ALTER TABLE onward_transcript_rows RENAME TO onward_transcript;
