-- Each message of a run's conversation, once, keyed by the seq of the event it came from;
-- message is msgspec JSON. Appended by the projector in the transaction that writes the run's
-- frontier row, which counts them (the handle). One table for every build of the frontiers
-- projection: a rebuild derives the same rows from the same counted events and keeps them.
CREATE TABLE onward_transcript (
    tenant text NOT NULL,
    run_id text NOT NULL,
    seq bigint NOT NULL,
    message bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
);
