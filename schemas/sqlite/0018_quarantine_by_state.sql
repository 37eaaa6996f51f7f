-- Every embedded catch-up looks for released runs: an index on (consumer, state) answers the
-- look with the released entries alone, however many entries years of cleared and nameless
-- records left (it read all of them).
CREATE INDEX IF NOT EXISTS onward_quarantine_by_state
    ON onward_quarantine (consumer, state, partition, log_offset);
