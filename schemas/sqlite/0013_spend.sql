-- What each model call cost (micros), keyed by its run and the seq its answer is written at:
-- a record under a key already there changes nothing. onward_spend_tenants keeps each tenant's
-- running total, raised in the same transaction as the insert that added to it, so a budget
-- check reads one row rather than summing every call the tenant ever made.
CREATE TABLE onward_spend (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq > 0),
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens INTEGER NOT NULL CHECK (output_tokens >= 0),
    micros INTEGER NOT NULL CHECK (micros >= 0),
    at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE onward_spend_tenants (
    tenant TEXT PRIMARY KEY,
    micros INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    calls INTEGER NOT NULL
);
