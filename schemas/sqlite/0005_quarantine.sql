-- Poison records: what the projector could not read, per consumer, by position (never the bytes).
-- state: held (the run is set aside), released (a person released it), cleared (folded again).
-- Times are microseconds since the epoch. The run's frontier row says why it is held.
CREATE TABLE onward_quarantine (
    consumer TEXT NOT NULL,
    partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,
    run_id TEXT,
    tenant TEXT,
    kind TEXT,
    reason TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('held', 'released', 'cleared')),
    quarantined_at INTEGER NOT NULL,
    released_by TEXT,
    released_at INTEGER,
    PRIMARY KEY (consumer, partition, log_offset)
);
CREATE INDEX onward_quarantine_by_run ON onward_quarantine (consumer, run_id);
ALTER TABLE onward_frontiers ADD COLUMN quarantined TEXT;
