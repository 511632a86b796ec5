-- pgdrain_worker: the privileges the drain function needs, and nothing more.
--
-- A NOLOGIN group role: CONNECT to this database; USAGE on schema pgdrain; SELECT, INSERT,
-- UPDATE, DELETE on pgdrain.active_jobs, pgdrain.finished_jobs, the view pgdrain.jobs,
-- pgdrain.kicks and the control plane's tables (runs, wakes, queue_limits); SELECT, DELETE on
-- the history partitions retention deletes rows from (finished_jobs_failed,
-- finished_jobs_done_default); EXECUTE on the functions that make (today to the day after
-- tomorrow) and drop the day partitions (they run as the schema's owner: the worker creates
-- and drops no table itself); SELECT,
-- UPDATE on pgdrain.run_gate (its row lock); SELECT, INSERT, UPDATE on pgdrain.periodic_slots;
-- SELECT, INSERT, DELETE on pgdrain.run_history; SELECT on pgdrain.lease_floor, the view
-- pgdrain.queue_floors and its marks, EXECUTE on pgdrain.lease_floor_raise and
-- pgdrain.queue_floors_raise (they run as the schema's owner); USAGE on the jobs id sequence (an enqueue from a job).
-- No DDL (it owns nothing and may create nothing), no access to pgdrain.migrations.
--
-- PostgreSQL grants some privileges to PUBLIC (every role), and a role cannot be refused what
-- PUBLIC holds. So, in this database only, this file also takes from PUBLIC:
--   * TEMPORARY (temporary tables), and
--   * EXECUTE on the server-side large-object functions (lo_create, lo_put, lowrite, ...):
--     the drain needs neither. Give them back to a role of yours that does:
--       GRANT TEMPORARY ON DATABASE mydb TO app_role;
--       GRANT EXECUTE ON FUNCTION lo_create(oid) TO app_role;   -- etc.
-- The large-object functions belong to the bootstrap superuser: without superuser rights the
-- REVOKE is skipped with a WARNING (managed services such as RDS: see docs/reliability.md).
--
-- Left to you (it changes every role): CONNECT to the OTHER databases of the cluster is also
-- PUBLIC's by default, so the worker can connect to them (and see their catalogs, not their
-- tables). Close that per database, after granting CONNECT to the roles that use it:
--       REVOKE CONNECT ON DATABASE otherdb FROM PUBLIC;
-- or restrict the worker's login role to this database in pg_hba.conf. This database keeps
-- working for the worker either way: it holds CONNECT here itself.
--
-- Advisory locks cannot be refused to a role: `pgdrain migrate` waits at most 30 s for its
-- lock, then names the session that holds it, so a worker cannot make a migration hang.
--
-- Run it as the owner of the pgdrain schema (a superuser for the large-object part), after
-- `pgdrain migrate`, in each database that holds a queue (roles are cluster-wide, grants are
-- per database; running it again is safe):
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
GRANT SELECT, INSERT, UPDATE, DELETE
    ON pgdrain.jobs, pgdrain.active_jobs, pgdrain.finished_jobs, pgdrain.kicks TO pgdrain_worker;
-- Retention deletes the rows of these partitions by name (migration 0018).
GRANT SELECT, DELETE ON pgdrain.finished_jobs_failed, pgdrain.finished_jobs_done_default
    TO pgdrain_worker;
-- The partitions of today to the day after tomorrow, no other range (migration 0048).
GRANT EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_ensure_ahead(),
                          pgdrain.finished_jobs_partition_drop(float8)
    TO pgdrain_worker;
-- Periodic jobs: a run records each slot it enqueued, once (migration 0008).
GRANT SELECT, INSERT, UPDATE ON pgdrain.periodic_slots TO pgdrain_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgdrain.runs, pgdrain.wakes, pgdrain.queue_limits
    TO pgdrain_worker;
-- Pause and resume (`pgdrain pause`, pgdrain.pause_queue from a job) write queue_limits as the
-- schema's owner (migration 0039).
GRANT EXECUTE ON FUNCTION pgdrain.queue_pause(text), pgdrain.queue_resume(text)
    TO pgdrain_worker;
GRANT SELECT, UPDATE ON pgdrain.run_gate TO pgdrain_worker;
-- The run history (migration 0019): a run's exit writes its line (ON CONFLICT reads the key),
-- retention deletes old ones. No UPDATE: a line is never changed.
GRANT SELECT, INSERT, DELETE ON pgdrain.run_history TO pgdrain_worker;
-- The floor of running jobs' leases (migration 0024): the reclaim and a run's exit read it, the
-- reclaim's round trip raises it.
GRANT SELECT ON pgdrain.lease_floor TO pgdrain_worker;
GRANT EXECUTE ON FUNCTION pgdrain.lease_floor_raise() TO pgdrain_worker;
-- Each queue's floor (migration 0026): the claim, a run's exit and the control plane read it, the
-- reclaim's round trip raises it. The claim and the readiness checks probe one queue's marks in
-- their index (migration 0035); the view gives every queue's floor at once.
GRANT SELECT ON pgdrain.queue_floors, pgdrain.queue_floor_marks TO pgdrain_worker;
GRANT EXECUTE ON FUNCTION pgdrain.queue_floors_raise() TO pgdrain_worker;
GRANT USAGE ON SEQUENCE pgdrain.jobs_id_seq TO pgdrain_worker;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    -- The database's name is not known in advance: format() quotes it as an identifier.
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO pgdrain_worker', current_database());
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE WARNING 'pgdrain_worker: not a superuser, so the large-object functions stay '
            'executable by PUBLIC in this database';
        RETURN;
    END IF;
    FOR fn IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace
          AND (p.proname LIKE 'lo\_%' OR p.proname IN ('loread', 'lowrite'))
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;
END
$$;
