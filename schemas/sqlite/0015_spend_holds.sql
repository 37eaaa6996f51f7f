-- The estimated cost of each model call being made, held against its run's and its tenant's
-- budgets from the check before the call until the call's record replaces it (or its failure
-- releases it), keyed as that record will be. onward_spend_tenants.held is the sum of a
-- tenant's holds, changed in the same transaction as the holds.
CREATE TABLE onward_spend_holds (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq > 0),
    tenant TEXT NOT NULL,
    micros INTEGER NOT NULL CHECK (micros >= 0),
    at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);

ALTER TABLE onward_spend_tenants ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
