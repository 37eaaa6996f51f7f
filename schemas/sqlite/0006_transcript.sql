-- Each message of a run's conversation, once, keyed by the seq of the event it came from;
-- message is msgspec JSON. Appended by the embedded fold in the transaction that writes the
-- run's frontier row, which counts them (the handle).
CREATE TABLE onward_transcript (
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message BLOB NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
) WITHOUT ROWID;
