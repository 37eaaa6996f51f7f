-- Poison records: what a projector could not read, per consumer (positions' names, so one set
-- per build), by position, never the bytes. state: held (the run is set aside), released (a
-- person released it), cleared (the projector folded it again). Times: microseconds since epoch.
CREATE TABLE onward_quarantine (
    consumer text NOT NULL,
    partition integer NOT NULL,
    log_offset bigint NOT NULL,
    run_id text,
    tenant text,
    kind text,
    reason text NOT NULL,
    state text NOT NULL CHECK (state IN ('held', 'released', 'cleared')),
    quarantined_at bigint NOT NULL,
    released_by text,
    released_at bigint,
    PRIMARY KEY (consumer, partition, log_offset)
);
CREATE INDEX onward_quarantine_by_run ON onward_quarantine (consumer, run_id);

-- Every frontier row says why its run is held (NULL: readable). Builds created from now on get
-- the column from frontiers.build.sql; existing ones get it here, and the view is repointed so
-- it shows the column.
DO $$
DECLARE
    b integer;
BEGIN
    FOR b IN SELECT build FROM onward_projection_builds WHERE projection = 'frontiers' LOOP
        EXECUTE format(
            'ALTER TABLE IF EXISTS onward_frontiers_%s ADD COLUMN IF NOT EXISTS quarantined text', b
        );
    END LOOP;
    SELECT build INTO b FROM onward_projection_builds
        WHERE projection = 'frontiers' AND status = 'active';
    IF b IS NOT NULL THEN
        EXECUTE format(
            'CREATE OR REPLACE VIEW onward_frontiers AS SELECT * FROM onward_frontiers_%s', b
        );
    END IF;
END $$;
