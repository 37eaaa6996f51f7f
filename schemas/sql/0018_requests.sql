-- What applications ask the workers of a PostgreSQL-only deployment to do (start, resume,
-- answer, tag, cancel a run): the Kafka backend's requests topic, as a table. A worker claims a
-- row for a while (claimed_by, claimed_until), renews the claim while it acts, and deletes the
-- row once acted on; a claim that lapses (its worker died) is taken by the next worker. A run's
-- requests are taken in id order.
CREATE TABLE onward_requests (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    kind text NOT NULL,
    body bytea NOT NULL,
    signature bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_by text,
    claimed_until timestamptz
);
CREATE INDEX onward_requests_by_run ON onward_requests (run_id, id);
