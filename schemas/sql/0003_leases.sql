-- Run leases: one worker per run. The row outlives a release (holder and expires_at become NULL)
-- so the run's fence only ever goes up; every acquisition raises it by one. Times are the
-- server's own (now()), never a time a worker sent.
CREATE TABLE onward_leases (
    run_id text PRIMARY KEY,
    tenant text NOT NULL,
    holder text,
    fence bigint NOT NULL CHECK (fence > 0),
    expires_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((holder IS NULL) = (expires_at IS NULL))
);
