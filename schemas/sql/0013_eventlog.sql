-- The event log on PostgreSQL alone (ONWARD_BACKEND=postgres): dense offsets per partition,
-- records as the codec wrote them. onward_log_partition holds each partition's bounds; an append
-- takes its partition's row lock to allocate offsets, so appenders of one partition commit in
-- offset order and no reader ever sees a gap. onward_log_meta keeps the partition count the log
-- was created with (its rows are written by the first log opened on the schema).
CREATE TABLE onward_log_meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE onward_log_partition (
    partition integer PRIMARY KEY CHECK (partition >= 0),
    start_offset bigint NOT NULL CHECK (start_offset >= 0),
    next_offset bigint NOT NULL CHECK (next_offset >= start_offset)
);
CREATE TABLE onward_log (
    partition integer NOT NULL,
    log_offset bigint NOT NULL,
    run_id text NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (partition, log_offset)
);
CREATE INDEX onward_log_by_run ON onward_log (run_id, partition, log_offset);
