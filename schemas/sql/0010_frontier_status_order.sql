-- `onward runs --status S` lists one status's runs by run id, a page at a time (keyset on
-- run_id): an index on (status, run_id) answers each page without reading the other statuses'
-- rows. Builds created from now on get it from frontiers.build.sql; existing ones get it here.
DO $$
DECLARE
    b integer;
BEGIN
    FOR b IN SELECT build FROM onward_projection_builds WHERE projection = 'frontiers' LOOP
        IF to_regclass(format('onward_frontiers_%s', b)) IS NOT NULL THEN
            EXECUTE format(
                'CREATE INDEX IF NOT EXISTS onward_frontiers_%s_by_status_run '
                'ON onward_frontiers_%s (status, run_id)', b, b
            );
        END IF;
    END LOOP;
END $$;
