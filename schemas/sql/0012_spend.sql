-- What each model call cost (micros), keyed by its run and the seq its answer is written at:
-- a record under a key already there changes nothing. onward_spend_tenants keeps each tenant's
-- running total, raised by the same statement as the insert that added to it, so a budget
-- check reads one row rather than summing every call the tenant ever made.
CREATE TABLE onward_spend (
    run_id text NOT NULL,
    seq bigint NOT NULL CHECK (seq > 0),
    tenant text NOT NULL,
    model text NOT NULL,
    input_tokens bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens bigint NOT NULL CHECK (output_tokens >= 0),
    micros bigint NOT NULL CHECK (micros >= 0),
    at bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE onward_spend_tenants (
    tenant text PRIMARY KEY,
    micros bigint NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    calls bigint NOT NULL
);
