-- Every frontier row names the person its run was started for (RunStarted.options' user), so
-- "who is waiting" can be asked per user. Builds created from now on get the column and its
-- index from frontiers.build.sql; existing ones get them here, and the view is repointed so it
-- shows the column. Rows folded before keep NULL until a rebuild folds them again.
DO $$
DECLARE
    b integer;
BEGIN
    FOR b IN SELECT build FROM onward_projection_builds WHERE projection = 'frontiers' LOOP
        EXECUTE format(
            'ALTER TABLE IF EXISTS onward_frontiers_%s ADD COLUMN IF NOT EXISTS user_id text', b
        );
        IF to_regclass(format('onward_frontiers_%s', b)) IS NOT NULL THEN
            EXECUTE format(
                'CREATE INDEX IF NOT EXISTS onward_frontiers_%s_by_user_status '
                'ON onward_frontiers_%s (user_id, status) WHERE user_id IS NOT NULL', b, b
            );
        END IF;
    END LOOP;
    SELECT build INTO b FROM onward_projection_builds
        WHERE projection = 'frontiers' AND status = 'active';
    IF b IS NOT NULL THEN
        EXECUTE format(
            'CREATE OR REPLACE VIEW onward_frontiers AS SELECT * FROM onward_frontiers_%s', b
        );
    END IF;
END $$;
