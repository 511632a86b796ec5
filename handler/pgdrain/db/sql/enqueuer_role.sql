-- pgdrain_enqueuer: what an application needs to enqueue jobs and kick the function, and
-- nothing more. The drain function's role (worker_role.sql) may update and delete every job
-- and every control table; the application needs none of that.
--
-- A NOLOGIN group role: CONNECT to this database; USAGE on schema pgdrain;
--   * INSERT on pgdrain.active_jobs (where an enqueue writes) and on the view pgdrain.jobs (where
--     an application's own SQL may), of the columns an enqueue writes only (queue, kind,
--     payload, priority, run_at, max_attempts, recovery_policy, idempotency_key, sequence,
--     depends_on): a new job is queued (or waiting: migration 0021's trigger decides, with its
--     owner's rights), with no attempt, lease or token of its own making; USAGE on the jobs id
--     sequence;
--   * SELECT on pgdrain.active_jobs and the view pgdrain.jobs, of the columns an enqueue and a
--     kick read only (id, queue, status, run_at, idempotency_key): the job an idempotency key
--     names, whether a queue has a job ready; never a payload, a kind, an error or a lease;
--   * SELECT, INSERT, UPDATE on pgdrain.kicks (kick's debounce) and SELECT, INSERT, UPDATE,
--     DELETE on pgdrain.wakes (the wake-up a kick of a delayed job records);
--   * SELECT (queue, paused_at, rate_limit, rate_seconds, window_start, window_started) on
--     pgdrain.queue_limits: a kick of a paused queue starts no run, nor of a queue whose rate
--     window is used up (it asks for a wake-up when the next window opens).
-- No UPDATE or DELETE of a job, no runs, no writes to queue limits, no periodic slots, no DDL.
--
-- Run it as the owner of the pgdrain schema, after `pgdrain migrate`, in each database that
-- holds a queue (running it again is safe), then make the application's role a member:
--
--   psql "$OWNER_URL" -v ON_ERROR_STOP=1 -f enqueuer_role.sql
--   psql "$OWNER_URL" -c "GRANT pgdrain_enqueuer TO app_role"
--
-- Run it again after a migration that adds a table. Unlike worker_role.sql it takes nothing
-- from PUBLIC: the application's own role keeps what it has.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_enqueuer') THEN
        CREATE ROLE pgdrain_enqueuer NOLOGIN;
    END IF;
EXCEPTION
    -- Another session created it between the check and the CREATE.
    WHEN duplicate_object OR unique_violation THEN NULL;
END
$$;

GRANT USAGE ON SCHEMA pgdrain TO pgdrain_enqueuer;
GRANT INSERT (queue, kind, payload, priority, run_at, max_attempts, recovery_policy,
              idempotency_key, sequence, depends_on)
    ON pgdrain.active_jobs, pgdrain.jobs TO pgdrain_enqueuer;
GRANT SELECT (id, queue, status, run_at, idempotency_key)
    ON pgdrain.active_jobs, pgdrain.jobs TO pgdrain_enqueuer;
GRANT USAGE ON SEQUENCE pgdrain.jobs_id_seq TO pgdrain_enqueuer;
GRANT SELECT, INSERT, UPDATE ON pgdrain.kicks TO pgdrain_enqueuer;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgdrain.wakes TO pgdrain_enqueuer;
GRANT SELECT (queue, paused_at, rate_limit, rate_seconds, window_start, window_started)
    ON pgdrain.queue_limits TO pgdrain_enqueuer;

DO $$
BEGIN
    -- The database's name is not known in advance: format() quotes it as an identifier.
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO pgdrain_enqueuer', current_database());
END
$$;
