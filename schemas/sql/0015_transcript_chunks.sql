-- A transcript row may hold several messages of its run: a projector stores the messages one
-- store folded for a run as one row (a chunk) keyed by the first one's seq, with last_seq the
-- last one's; a row of one message keeps last_seq NULL and its body as before. A chunk's body
-- is a JSON array of [seq, message] pairs, zstd-compressed when that is shorter. A reader
-- takes each seq once: rows of two builds may overlap.
ALTER TABLE onward_transcript ADD COLUMN last_seq bigint;
ALTER TABLE onward_transcript ADD CONSTRAINT onward_transcript_chunk_order
    CHECK (last_seq IS NULL OR last_seq > seq);

-- Bodies are compressed already: stored out of line as they are, not compressed again.
ALTER TABLE onward_transcript ALTER COLUMN message SET STORAGE EXTERNAL;
