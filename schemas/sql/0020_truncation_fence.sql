-- onward_run_truncation.fence: the highest fence admitted among the run's events below its point.
-- A cut can leave a superseded writer's refused events as the run's first records in the log;
-- the next pass judges the run's events from the point with this fence, as the fold did, rather
-- than take the first record it meets as counted. 0: unknown (a point stored before this column).
ALTER TABLE onward_run_truncation ADD COLUMN fence bigint NOT NULL DEFAULT 0;
