-- Every frontier row names the person its run was started for (RunStarted.options' user), so
-- "who is waiting" can be asked per user. Rows folded before keep NULL.
ALTER TABLE onward_frontiers ADD COLUMN user_id TEXT;
CREATE INDEX onward_frontiers_by_user_status ON onward_frontiers (user_id, status)
    WHERE user_id IS NOT NULL;
