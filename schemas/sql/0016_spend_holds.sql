-- The estimated cost of each model call being made, held against its run's and its tenant's
-- budgets from the check before the call until the call's record replaces it (or its failure
-- releases it), keyed as that record will be. onward_spend_tenants.held is the sum of a
-- tenant's holds, changed by the same transaction as the holds, and its row is the lock that
-- makes one tenant's checks and holds take turns.
CREATE TABLE onward_spend_holds (
    run_id text NOT NULL,
    seq bigint NOT NULL CHECK (seq > 0),
    tenant text NOT NULL,
    micros bigint NOT NULL CHECK (micros >= 0),
    at bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
);

ALTER TABLE onward_spend_tenants ADD COLUMN held bigint NOT NULL DEFAULT 0;
