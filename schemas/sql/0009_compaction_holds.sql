-- Compaction without holders (DESIGN §7): no run holds its partition's watermark, so whatever a
-- run may still need below a cut is kept per run first.
-- onward_run_truncation.whole: every counted event of the run below its point is retained (a
-- run read from its first event: a LangGraph thread, a pydantic-ai run, a quarantined run, a
-- frontier over the snapshot cap), so readers read the retained events, then the log.
-- onward_retained_events.kept_as: why a copy is kept: 'tag' (a tag points at it), 'checkpoint'
-- (one of a live run's last resume points; older ones are dropped) or 'history' (a whole run).
-- onward_tag_pins: every tag's target, written before its Tagged event under a lock the pass
-- shares, so a pass either retains the target or the tag is refused.
-- onward_run_tombstones: runs GC collected, so the compactor knows their events are finished.
-- onward_run_snapshots: the frontier of a run whose snapshot was refused for size in its row,
-- stored here uncapped, so the run is resumed and folded on from it, not from its first event.
ALTER TABLE onward_run_truncation ADD COLUMN whole boolean NOT NULL DEFAULT false;
ALTER TABLE onward_retained_events ADD COLUMN kept_as text NOT NULL DEFAULT 'tag';
CREATE TABLE onward_tag_pins (
    run_id text NOT NULL,
    seq bigint NOT NULL,
    tenant text NOT NULL,
    pinned_at bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE onward_run_tombstones (
    run_id text PRIMARY KEY,
    tenant text NOT NULL,
    collected_at bigint NOT NULL
);
CREATE TABLE onward_run_snapshots (
    run_id text PRIMARY KEY,
    tenant text NOT NULL,
    through_offset bigint NOT NULL,
    payload bytea NOT NULL
);
