-- The agent a start request is for, so that a worker claims only the starts of agents it
-- carries: the workers of one PostgreSQL deployment may carry different agents. NULL for the
-- other kinds of request, and for starts stored before this column (any worker takes those).
ALTER TABLE onward_requests ADD COLUMN agent text;
