-- Run leases: one worker per run. The row outlives a release (holder and expires_at become NULL)
-- so the run's fence only ever goes up; every acquisition raises it by one. expires_at is in
-- seconds since the epoch by SQLite's own clock (julianday('now')), never a time a caller sent.
CREATE TABLE onward_leases (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    holder TEXT,
    fence INTEGER NOT NULL CHECK (fence > 0),
    expires_at REAL,
    CHECK ((holder IS NULL) = (expires_at IS NULL))
);
