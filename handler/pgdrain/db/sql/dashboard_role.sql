-- pgdrain_dashboard and pgdrain_dashboard_actions: the dashboard's roles (pgdrain ui, and the
-- Dashboard function of template.yaml), apart from the drain's pgdrain_worker.
--
-- pgdrain_dashboard (NOLOGIN) reads: CONNECT to this database; USAGE on schema pgdrain;
-- SELECT on pgdrain.jobs (the view), the tables it reads (active_jobs, finished_jobs), the
-- control plane's tables (runs, run_history, wakes, kicks, queue_limits) and the queues' floors
-- (pgdrain.queue_floors and its marks, pgdrain.queue_floor_marks: where a resume looks for a
-- ready job).
-- It writes nothing, so a dashboard that connects with it cannot change a job, whatever it is
-- asked (the function's PGDRAIN_UI_ACTIONS=false hides the buttons; this is what holds).
--
-- pgdrain_dashboard_actions (NOLOGIN, a member of pgdrain_dashboard) may also retry and cancel:
-- UPDATE of the columns a retry and a cancel write on pgdrain.jobs (the view: its trigger moves
-- a retried or cancelled job between active_jobs and finished_jobs as the schema's owner),
-- UPDATE of updated_at on pgdrain.active_jobs (a cancel locks the jobs it cancels there first),
-- and pause and resume a queue: EXECUTE on pgdrain.queue_pause and pgdrain.queue_resume, which
-- write pgdrain.queue_limits as the schema's owner (migration 0039: a grant on the table would
-- let the role clear any queue's limits), and INSERT, UPDATE on pgdrain.kicks (a resume kicks
-- the drain function when a job is ready, debounced there as every kick is). No INSERT or
-- DELETE of a job (it cannot enqueue or purge), no write of a queue's limits, no DDL, no access
-- to pgdrain.migrations.
--
-- PUBLIC's TEMPORARY and large-object functions: see worker_role.sql, which takes them away
-- from PUBLIC in this database; run it first if the dashboard's login role must not have them.
--
-- Run it as the owner of the pgdrain schema, after `pgdrain migrate`, in each database that
-- holds a queue (running it again is safe), then make the login role of the dashboard:
--
--   psql "$ADMIN_DATABASE_URL" -v ON_ERROR_STOP=1 -f dashboard_role.sql
--   psql "$ADMIN_DATABASE_URL" -c "CREATE ROLE dashboard_fn LOGIN PASSWORD '…' IN ROLE pgdrain_dashboard"
--   (or IN ROLE pgdrain_dashboard_actions, with WebDashboardActions=true)

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard') THEN
        CREATE ROLE pgdrain_dashboard NOLOGIN;
    END IF;
EXCEPTION
    -- Another session created it between the check and the CREATE.
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard_actions') THEN
        CREATE ROLE pgdrain_dashboard_actions NOLOGIN IN ROLE pgdrain_dashboard;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;

GRANT USAGE ON SCHEMA pgdrain TO pgdrain_dashboard;
GRANT SELECT ON pgdrain.jobs, pgdrain.active_jobs, pgdrain.finished_jobs, pgdrain.runs,
                pgdrain.wakes, pgdrain.kicks, pgdrain.queue_limits, pgdrain.run_history,
                pgdrain.queue_floors, pgdrain.queue_floor_marks
    TO pgdrain_dashboard;

-- Only the columns a retry and a cancel write (job_retry, job_cancel): not a job's kind,
-- payload or errors, which would let the role enqueue work of its own or rewrite a job's
-- history. A column's grant does not limit the values written: the view's trigger lets a role
-- that may not write active_jobs' payload change a job only as a retry or a cancel does
-- (migration 0033), never to done or failed. The REVOKE takes back a whole-table UPDATE this
-- file granted before (and the columns' with it); running the file again ends in the same
-- grants.
REVOKE UPDATE ON pgdrain.jobs, pgdrain.active_jobs FROM pgdrain_dashboard_actions;
GRANT UPDATE (status, attempts, run_at, finished_at, updated_at,
              lease_expires_at, leased_by, attempt_token, heartbeat_at)
    ON pgdrain.jobs TO pgdrain_dashboard_actions;
-- A cancel locks the jobs it cancels in active_jobs first: FOR UPDATE needs UPDATE on a
-- column. updated_at decides nothing (status would let the role finish a job in place).
GRANT UPDATE (updated_at) ON pgdrain.active_jobs TO pgdrain_dashboard_actions;
-- The REVOKE takes back the writes this file granted before migration 0039.
REVOKE INSERT, UPDATE, DELETE ON pgdrain.queue_limits FROM pgdrain_dashboard_actions;
GRANT EXECUTE ON FUNCTION pgdrain.queue_pause(text), pgdrain.queue_resume(text)
    TO pgdrain_dashboard_actions;
GRANT INSERT, UPDATE ON pgdrain.kicks TO pgdrain_dashboard_actions;
-- A resume of a queue whose jobs are due later reserves their wake-up, as an enqueue's kick
-- does (migration 0049).
GRANT SELECT, INSERT, UPDATE, DELETE ON pgdrain.wakes TO pgdrain_dashboard_actions;

DO $$
BEGIN
    -- The database's name is not known in advance: format() quotes it as an identifier.
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO pgdrain_dashboard', current_database());
END
$$;
