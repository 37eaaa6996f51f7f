-- A LangGraph thread's fold at one of its events (OnwardSaver), so a reader folds only the
-- log after it. Written by the thread's holder, replaced only by a later one (a higher
-- last_seq); a cache: a reader that cannot use it folds the thread from its first event.
CREATE TABLE onward_graph_summaries (
    run_id text PRIMARY KEY,
    tenant text NOT NULL,
    last_seq bigint NOT NULL CHECK (last_seq > 0),
    body bytea NOT NULL
);

-- The body is zstd-compressed already: stored out of line as it is, not compressed again.
ALTER TABLE onward_graph_summaries ALTER COLUMN body SET STORAGE EXTERNAL;
