-- pgdrain 0032: the dashboard's actions role updates only the columns a retry and a cancel
-- write. dashboard_role.sql granted it UPDATE on every column of pgdrain.jobs and active_jobs:
-- a member could rewrite a job's kind and payload (work of its own choosing, an enqueue in all
-- but name) or wipe its error history. A role granted before this migration keeps that until
-- dashboard_role.sql is run again: the narrowing is made here too, where the role exists.
-- Catalog change only; safe to run again (the same grants result).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard_actions') THEN
        REVOKE UPDATE ON pgdrain.jobs, pgdrain.active_jobs FROM pgdrain_dashboard_actions;
        GRANT UPDATE (status, attempts, run_at, finished_at, updated_at,
                      lease_expires_at, leased_by, attempt_token, heartbeat_at)
            ON pgdrain.jobs TO pgdrain_dashboard_actions;
        GRANT UPDATE (status) ON pgdrain.active_jobs TO pgdrain_dashboard_actions;
    END IF;
END
$$;
