-- Content-addressed bodies too large for one log record (claim check); events carry the digest.
CREATE TABLE onward_blobs (
    digest text PRIMARY KEY,
    body bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
