-- Compaction. onward_run_truncation: per run, the seq below which its events are compacted
-- (readers treat them as gone; the frontier row and the transcript hold what resume needs) and
-- the log offset of the first event kept. It only ever moves forward.
-- onward_retained_events: tagged events below a run's truncation point, copied (as the codec
-- encoded them) in the transaction that moved the point, so they outlive the cut.
-- onward_log_cuts: each prefix of a partition the compactor cut, and the archive holding it.
CREATE TABLE onward_run_truncation (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    partition INTEGER NOT NULL,
    before_seq INTEGER NOT NULL,
    before_offset INTEGER NOT NULL,
    compacted_at INTEGER NOT NULL
);
CREATE TABLE onward_retained_events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE onward_log_cuts (
    partition INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    events INTEGER NOT NULL,
    archive TEXT,
    cut_at INTEGER NOT NULL,
    PRIMARY KEY (partition, start_offset)
);
