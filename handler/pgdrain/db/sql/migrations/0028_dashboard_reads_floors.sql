-- pgdrain 0028: a resume (`pgdrain resume`, the dashboard's Resume) looks for a ready job from
-- its queue's floor (queue_has_ready, as every claim and check since 0026), so the dashboard's
-- role reads pgdrain.queue_floors. A dashboard role granted before this migration would fail
-- every Resume until dashboard_role.sql is run again: the grant is made here too, where the
-- role exists (the role file makes it on a database that has none yet).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard') THEN
        GRANT SELECT ON pgdrain.queue_floors TO pgdrain_dashboard;
    END IF;
END
$$;
