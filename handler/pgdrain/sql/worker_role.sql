-- pgdrain_worker: the privileges the drain function needs, and nothing more.
--
-- A NOLOGIN group role: USAGE on schema pgdrain; SELECT, INSERT, UPDATE, DELETE on
-- pgdrain.jobs and pgdrain.kicks and the control plane's tables (runs, wakes, queue_limits);
-- SELECT, UPDATE on pgdrain.run_gate (its row lock); USAGE on the jobs id sequence (an
-- enqueue from a job).
-- No DDL (it owns nothing and may create nothing), no access to pgdrain.migrations.
--
-- Run it as the owner of the pgdrain schema, after `pgdrain migrate`, in each database that
-- holds a queue (roles are cluster-wide, grants are per database; running it again is safe):
--
--   psql "$ADMIN_DATABASE_URL" -v ON_ERROR_STOP=1 -f worker_role.sql
--   psql "$ADMIN_DATABASE_URL" -c "CREATE ROLE drain_fn LOGIN PASSWORD '…' IN ROLE pgdrain_worker"
--
-- The function then connects as drain_fn. Run it again after a migration that adds a table.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_worker') THEN
        CREATE ROLE pgdrain_worker NOLOGIN;
    END IF;
EXCEPTION
    -- Another session created it between the check and the CREATE.
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;

GRANT USAGE ON SCHEMA pgdrain TO pgdrain_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgdrain.jobs, pgdrain.kicks TO pgdrain_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgdrain.runs, pgdrain.wakes, pgdrain.queue_limits
    TO pgdrain_worker;
GRANT SELECT, UPDATE ON pgdrain.run_gate TO pgdrain_worker;
GRANT USAGE ON SEQUENCE pgdrain.jobs_id_seq TO pgdrain_worker;
