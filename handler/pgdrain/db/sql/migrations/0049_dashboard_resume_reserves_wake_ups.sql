-- pgdrain 0049: the dashboard's Resume reserves a wake-up, as a red team found it missing.
--
-- A resume kicked only a queue with a job ready; the kick held while it was paused had set no
-- wake-up, so a job due in two minutes waited for the hourly safety net. A resume now kicks as
-- an enqueue does, and a kick reserves a wake-up in pgdrain.wakes for jobs due later: the
-- dashboard's actions role may write it now (as dashboard_role.sql grants). Catalog changes
-- only.

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard_actions') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgdrain.wakes TO pgdrain_dashboard_actions;
    END IF;
END
$$;
