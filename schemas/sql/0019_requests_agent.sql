-- The agent a request is for, so that a worker claims only the requests of agents it carries:
-- the workers of one PostgreSQL deployment may carry different agents. Set for starts, and for
-- answers and resumes that name their run's agent; NULL for the other requests (any worker
-- takes those). A start stored before this column is NULL too: any worker may claim it, and
-- one that lacks the agent its signed body names stores the row for that agent and hands it
-- back (a worker carrying it takes it).
ALTER TABLE onward_requests ADD COLUMN agent text;
