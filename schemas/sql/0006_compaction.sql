-- Compaction. onward_run_truncation: per run, the seq below which its events are compacted
-- (readers treat them as gone; the frontier row and the transcript hold what resume needs) and
-- the log offset of the first event kept. It only ever moves forward.
-- onward_retained_events: tagged events below a run's truncation point, copied (as the codec
-- encoded them) in the transaction that moved the point, so they outlive the cut.
-- onward_log_cuts: each prefix of a partition the compactor cut, and the archive holding it.
CREATE TABLE onward_run_truncation (
    run_id text PRIMARY KEY,
    tenant text NOT NULL,
    partition integer NOT NULL,
    before_seq bigint NOT NULL,
    before_offset bigint NOT NULL,
    compacted_at bigint NOT NULL
);
CREATE TABLE onward_retained_events (
    run_id text NOT NULL,
    seq bigint NOT NULL,
    tenant text NOT NULL,
    partition integer NOT NULL,
    log_offset bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE onward_log_cuts (
    partition integer NOT NULL,
    start_offset bigint NOT NULL,
    end_offset bigint NOT NULL,
    events bigint NOT NULL,
    archive text,
    cut_at bigint NOT NULL,
    PRIMARY KEY (partition, start_offset)
);
