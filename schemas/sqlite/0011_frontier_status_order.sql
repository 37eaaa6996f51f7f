-- `onward runs --status S` lists one status's runs by run id, a page at a time (keyset on
-- run_id): an index on (status, run_id) answers each page without reading the other statuses'
-- rows.
CREATE INDEX onward_frontiers_by_status_run ON onward_frontiers (status, run_id);
