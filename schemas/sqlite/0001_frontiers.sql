-- Frontier rows, tool_calls rows and projector positions for the embedded store.
CREATE TABLE onward_frontiers (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    revision TEXT NOT NULL,
    status TEXT NOT NULL,
    holder TEXT,
    iteration INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    fence INTEGER NOT NULL,
    last_boundary TEXT,
    resume_seq INTEGER NOT NULL,
    waiting_on TEXT,
    refused INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    through_offset INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    payload BLOB,
    snapshot_error TEXT
);
CREATE INDEX onward_frontiers_by_tenant_status ON onward_frontiers (tenant, status);
CREATE TABLE onward_tool_calls (
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    tool TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fence INTEGER,
    dispatched_at INTEGER,
    completed_at INTEGER,
    outcome TEXT,
    latency_us INTEGER,
    through_offset INTEGER NOT NULL,
    PRIMARY KEY (run_id, call_id)
);
CREATE TABLE onward_projector_positions (
    consumer TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (consumer, partition)
);
