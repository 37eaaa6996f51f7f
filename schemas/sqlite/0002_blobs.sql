-- Content-addressed bodies too large for one log record (claim check); events carry the digest.
CREATE TABLE onward_blobs (
    digest TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
