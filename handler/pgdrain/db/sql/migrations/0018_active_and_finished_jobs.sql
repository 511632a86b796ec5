-- pgdrain 0018: a hot table bounded by the work in flight, and a history dropped by the day.
--
-- pgdrain.active_jobs (the table pgdrain.jobs was, renamed) holds the jobs not finished: queued,
-- running, parked. A job that finishes (done, failed, cancelled) leaves it in the statement that
-- finishes it, for pgdrain.finished_jobs: partitioned by status, done jobs by day of finished_at
-- (finished_jobs_YYYYMMDD, dropped whole once past retention), failed and cancelled ones (rare,
-- kept longer) in one table of their own, deleted by rows. pgdrain.jobs becomes a view of both,
-- with the columns it always had: operator commands, the dashboard and users' SQL read it, and
-- its INSTEAD OF triggers route a write to the table that holds (or must hold) the row. The drain
-- itself never writes through the view. docs/decisions/0012-active-and-finished-jobs.md.
--
-- Nothing here reads or copies the history: the renames and the new empty tables are catalog
-- changes, so the migration holds its locks for milliseconds on any length of table. Finished
-- rows left in active_jobs move to finished_jobs afterwards, in batches of their own short
-- transactions (`pgdrain migrate` once it has committed, and each scheduled run's retention until
-- none is left: pgdrain.db.retention); the view shows each row once meanwhile.

ALTER TABLE pgdrain.jobs RENAME TO active_jobs;

-- The indexes keep their names and predicates: rebuilding one would read the whole table under
-- lock. jobs_active_key_idx (idempotency keys) keeps `status IN (...)` while finished rows wait to
-- move; jobs_finished_idx and jobs_finished_queue_idx serve only that move, and stay empty after.

-- Room on each page for a claim's and a heartbeat's new row version beside the old one: the
-- update stays on its page, and its WAL record holds only what changed.
ALTER TABLE pgdrain.active_jobs SET (fillfactor = 70);

-- The history. Only what a finished job has: no lease, no token of a running attempt, no claim
-- id (NULL in the view). completed_token stays: lost-reply recovery reads it.
CREATE TABLE pgdrain.finished_jobs (
    id               bigint      NOT NULL,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    payload          jsonb       NOT NULL,
    status           text        NOT NULL,
    priority         integer     NOT NULL,
    run_at           timestamptz NOT NULL,
    attempts         integer     NOT NULL,
    max_attempts     integer     NOT NULL,
    recovery_policy  text        NOT NULL,
    reclaim_count    integer     NOT NULL,
    idempotency_key  text,
    last_error       text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL,
    completed_token  uuid,
    errors           jsonb       NOT NULL,
    CONSTRAINT finished_jobs_status_chk CHECK (status IN ('done', 'failed', 'cancelled'))
) PARTITION BY LIST (status);

-- Done jobs, one partition a day (pgdrain.finished_jobs_partition_ensure makes them ahead); the
-- default takes a day whose partition is missing, so a completion never fails for want of one.
CREATE TABLE pgdrain.finished_jobs_done PARTITION OF pgdrain.finished_jobs
    FOR VALUES IN ('done') PARTITION BY RANGE (finished_at);
CREATE TABLE pgdrain.finished_jobs_done_default PARTITION OF pgdrain.finished_jobs_done DEFAULT;
CREATE TABLE pgdrain.finished_jobs_failed PARTITION OF pgdrain.finished_jobs
    FOR VALUES IN ('failed', 'cancelled');

-- By id: `jobs show`, lost-reply recovery, retry, a page of jobs newest first.
CREATE INDEX finished_jobs_id_idx ON pgdrain.finished_jobs (id);
-- By queue and status, newest first: a page of one status (and queue), `stats`' bounded counts
-- per queue and its walk through the queues, read through the view as before (0017).
CREATE INDEX finished_jobs_queue_idx ON pgdrain.finished_jobs (queue, status, id);
-- By age, for retention's rows (failed and cancelled, rare) and the dashboard's per-minute
-- counts. Done jobs: a BRIN summary (their rows arrive in finished_at order), which costs a
-- completion nothing where a b-tree costs an entry each.
CREATE INDEX finished_jobs_failed_finished_idx ON pgdrain.finished_jobs_failed (finished_at);
CREATE INDEX finished_jobs_done_finished_idx ON pgdrain.finished_jobs_done
    USING brin (finished_at) WITH (autosummarize = on);

-- Make the day partitions of done jobs from day_from to day_to (UTC days), those missing.
-- Serialised by a transaction advisory lock (two runs, or a run and `pgdrain migrate`, may call
-- it at once: the second finds the partitions made and makes nothing), so safe to run twice
-- and concurrently. Each is created on its own and then attached: ATTACH takes SHARE UPDATE
-- EXCLUSIVE on finished_jobs_done, which completions (ROW EXCLUSIVE) do not wait for, where
-- CREATE ... PARTITION OF would lock them out. A day whose rows went to the default partition
-- (maintenance lapsed) is skipped with a NOTICE: those rows stay there, retention deletes them
-- by age. Returns how many were made.
CREATE FUNCTION pgdrain.finished_jobs_partition_ensure(day_from date, day_to date)
RETURNS integer
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    day date;
    name text;
    made integer := 0;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdrain.finished_jobs'));
    day := day_from;
    WHILE day <= day_to LOOP
        name := 'finished_jobs_' || pg_catalog.to_char(day, 'YYYYMMDD');
        IF pg_catalog.to_regclass('pgdrain.' || name) IS NULL THEN
            IF EXISTS (SELECT 1 FROM pgdrain.finished_jobs_done_default AS d
                       WHERE d.finished_at >= day::timestamp AT TIME ZONE 'UTC'
                         AND d.finished_at < (day + 1)::timestamp AT TIME ZONE 'UTC') THEN
                RAISE NOTICE 'pgdrain: % not made: its done jobs are in the default partition', name;
            ELSE
                EXECUTE pg_catalog.format(
                    'CREATE TABLE pgdrain.%I (LIKE pgdrain.finished_jobs_done INCLUDING DEFAULTS'
                    ' INCLUDING CONSTRAINTS)', name);
                -- The partition's bound as a CHECK first: ATTACH then needs no scan of it.
                EXECUTE pg_catalog.format(
                    'ALTER TABLE pgdrain.%I ADD CONSTRAINT %I CHECK (status = ''done'' AND'
                    ' finished_at IS NOT NULL AND finished_at >= %L AND finished_at < %L)',
                    name, name || '_chk', day::timestamp AT TIME ZONE 'UTC',
                    (day + 1)::timestamp AT TIME ZONE 'UTC');
                EXECUTE pg_catalog.format(
                    'ALTER TABLE pgdrain.finished_jobs_done ATTACH PARTITION pgdrain.%I'
                    ' FOR VALUES FROM (%L) TO (%L)',
                    name, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
                made := made + 1;
            END IF;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN made;
END
$$;

-- Drop the day partitions of done jobs whose whole day ended more than done_days ago: DETACH, then
-- DROP, each a catalog change however many rows it held. DETACH ... CONCURRENTLY is refused
-- where a default partition exists, so the DETACH takes ACCESS EXCLUSIVE on finished_jobs_done for
-- its instant (completions wait that long), under the caller's lock_timeout. Serialised with
-- finished_jobs_partition_ensure; safe to run twice and concurrently. Returns how many went.
CREATE FUNCTION pgdrain.finished_jobs_partition_drop(done_days float8)
RETURNS integer
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    part record;
    dropped integer := 0;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdrain.finished_jobs'));
    FOR part IN
        SELECT c.relname
        FROM pg_catalog.pg_inherits AS i
        JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'pgdrain.finished_jobs_done'::regclass
          AND c.relname ~ '^finished_jobs_[0-9]{8}$'
          AND (pg_catalog.to_date(pg_catalog.substr(c.relname, 15), 'YYYYMMDD') + 1)::timestamp
                  AT TIME ZONE 'UTC' <= now() - done_days * interval '1 day'
        ORDER BY c.relname
    LOOP
        EXECUTE pg_catalog.format(
            'ALTER TABLE pgdrain.finished_jobs_done DETACH PARTITION pgdrain.%I', part.relname);
        EXECUTE pg_catalog.format('DROP TABLE pgdrain.%I', part.relname);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;

-- Is partition housekeeping due: a partition to make (the day after tomorrow's missing), one to
-- drop (older than done_days), or history left in active_jobs to move. Catalog lookups and one
-- probe of jobs_finished_idx: cheap enough for every run's exit.
CREATE FUNCTION pgdrain.finished_jobs_partition_due(done_days float8)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.to_regclass('pgdrain.finished_jobs_'
               || pg_catalog.to_char((now() AT TIME ZONE 'UTC')::date + 2, 'YYYYMMDD')) IS NULL
        OR EXISTS (
            SELECT 1
            FROM pg_catalog.pg_inherits AS i
            JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'pgdrain.finished_jobs_done'::regclass
              AND c.relname ~ '^finished_jobs_[0-9]{8}$'
              AND (pg_catalog.to_date(pg_catalog.substr(c.relname, 15), 'YYYYMMDD') + 1)::timestamp
                      AT TIME ZONE 'UTC' <= now() - done_days * interval '1 day')
        OR EXISTS (SELECT 1 FROM pgdrain.active_jobs
                   WHERE status IN ('done', 'failed', 'cancelled'))
$$;

-- Only the roles given them (worker_role.sql) run the partition functions.
REVOKE EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_ensure(date, date) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_drop(float8) FROM PUBLIC;

-- Days of history not yet moved, and today and the next two: the moved rows land in their day.
SELECT pgdrain.finished_jobs_partition_ensure(
    coalesce((SELECT min(finished_at) FROM pgdrain.active_jobs
              WHERE status IN ('done', 'failed', 'cancelled')),
             now())::date,
    (now() AT TIME ZONE 'UTC')::date + 2);

-- The view: every job, with the columns pgdrain.jobs always had, in their order.
CREATE VIEW pgdrain.jobs AS
SELECT id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
       recovery_policy, reclaim_count, lease_expires_at, leased_by, attempt_token,
       heartbeat_at, idempotency_key, last_error, created_at, updated_at, finished_at,
       completed_token, errors, claim_id
FROM pgdrain.active_jobs
UNION ALL
SELECT id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
       recovery_policy, reclaim_count, NULL::timestamptz, NULL::text, NULL::uuid,
       NULL::timestamptz, idempotency_key, last_error, created_at, updated_at, finished_at,
       completed_token, errors, NULL::uuid
FROM pgdrain.finished_jobs;

-- An INSERT through the view gets the table's defaults.
ALTER VIEW pgdrain.jobs ALTER COLUMN id SET DEFAULT nextval('pgdrain.jobs_id_seq');
ALTER VIEW pgdrain.jobs ALTER COLUMN queue SET DEFAULT 'default';
ALTER VIEW pgdrain.jobs ALTER COLUMN payload SET DEFAULT '{}'::jsonb;
ALTER VIEW pgdrain.jobs ALTER COLUMN status SET DEFAULT 'queued';
ALTER VIEW pgdrain.jobs ALTER COLUMN priority SET DEFAULT 0;
ALTER VIEW pgdrain.jobs ALTER COLUMN run_at SET DEFAULT now();
ALTER VIEW pgdrain.jobs ALTER COLUMN attempts SET DEFAULT 0;
ALTER VIEW pgdrain.jobs ALTER COLUMN max_attempts SET DEFAULT 5;
ALTER VIEW pgdrain.jobs ALTER COLUMN recovery_policy SET DEFAULT 'auto';
ALTER VIEW pgdrain.jobs ALTER COLUMN reclaim_count SET DEFAULT 0;
ALTER VIEW pgdrain.jobs ALTER COLUMN created_at SET DEFAULT now();
ALTER VIEW pgdrain.jobs ALTER COLUMN updated_at SET DEFAULT now();
ALTER VIEW pgdrain.jobs ALTER COLUMN errors SET DEFAULT '[]'::jsonb;

-- Writes through the view, one row at a time, to the table the row's status belongs in: an
-- UPDATE that finishes a job (or retries a finished one) moves it across, in the statement that
-- changes it. For users' SQL and for `pgdrain retry` and `cancel` (operator actions, a few rows
-- at a time): a role with UPDATE on the view (the dashboard's actions role) retries and cancels
-- without any right to insert or delete jobs. The drain never writes through the view.
CREATE FUNCTION pgdrain.jobs_view_write() RETURNS trigger
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM pgdrain.active_jobs WHERE id = OLD.id;
        IF NOT FOUND THEN
            DELETE FROM pgdrain.finished_jobs WHERE id = OLD.id;
        END IF;
        RETURN OLD;
    END IF;
    -- An UPDATE writes the row only as the statement read it (its status and token unchanged):
    -- the view's rows are not locked when read (not even by FOR UPDATE), so two statements that
    -- read the same queued job (two claims of an older pgdrain) must not both take it. The one
    -- that comes second waits for the first's row lock, finds the row changed, and writes
    -- nothing for it (RETURN NULL: the row is not reported as updated).
    IF NEW.status IN ('done', 'failed', 'cancelled') THEN
        -- finished_jobs has no lease columns: a finished row with a lease is refused as the
        -- table's CHECK refused it (0001).
        IF NEW.lease_expires_at IS NOT NULL OR NEW.leased_by IS NOT NULL
           OR NEW.attempt_token IS NOT NULL OR NEW.heartbeat_at IS NOT NULL THEN
            RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_lease_chk"'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_lease_chk',
                      TABLE = 'jobs', SCHEMA = 'pgdrain';
        END IF;
        NEW.finished_at := coalesce(NEW.finished_at, now());
        NEW.claim_id := NULL;
        IF TG_OP = 'UPDATE' THEN
            UPDATE pgdrain.finished_jobs SET
                (queue, kind, payload, status, priority, run_at, attempts, max_attempts,
                 recovery_policy, reclaim_count, idempotency_key, last_error, created_at,
                 updated_at, finished_at, completed_token, errors)
              = (NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
                 NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
                 NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
                 NEW.finished_at, NEW.completed_token, NEW.errors)
            WHERE id = OLD.id
              AND status = OLD.status  -- as the statement read it
            ;
            IF FOUND THEN
                RETURN NEW;
            END IF;
            DELETE FROM pgdrain.active_jobs
            WHERE id = OLD.id
              AND status = OLD.status  -- as the statement read it
              AND attempt_token IS NOT DISTINCT FROM OLD.attempt_token  -- as the statement read it
            ;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
        END IF;
        INSERT INTO pgdrain.finished_jobs
            (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
             recovery_policy, reclaim_count, idempotency_key, last_error, created_at,
             updated_at, finished_at, completed_token, errors)
        VALUES (NEW.id, NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
                NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
                NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
                NEW.finished_at, NEW.completed_token, NEW.errors);
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        UPDATE pgdrain.active_jobs SET
            (queue, kind, payload, status, priority, run_at, attempts, max_attempts,
             recovery_policy, reclaim_count, lease_expires_at, leased_by, attempt_token,
             heartbeat_at, idempotency_key, last_error, created_at, updated_at, finished_at,
             completed_token, errors, claim_id)
          = (NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
             NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
             NEW.lease_expires_at, NEW.leased_by, NEW.attempt_token, NEW.heartbeat_at,
             NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
             NEW.finished_at, NEW.completed_token, NEW.errors, NEW.claim_id)
        WHERE id = OLD.id
          AND status = OLD.status  -- as the statement read it
          AND attempt_token IS NOT DISTINCT FROM OLD.attempt_token  -- as the statement read it
        ;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        DELETE FROM pgdrain.finished_jobs
        WHERE id = OLD.id
          AND status = OLD.status  -- as the statement read it
        ;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO pgdrain.active_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, lease_expires_at, leased_by, attempt_token,
         heartbeat_at, idempotency_key, last_error, created_at, updated_at, finished_at,
         completed_token, errors, claim_id)
    OVERRIDING SYSTEM VALUE VALUES
           (NEW.id, NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
            NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
            NEW.lease_expires_at, NEW.leased_by, NEW.attempt_token, NEW.heartbeat_at,
            NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
            NEW.finished_at, NEW.completed_token, NEW.errors, NEW.claim_id);
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_view_write
    INSTEAD OF INSERT OR UPDATE OR DELETE ON pgdrain.jobs
    FOR EACH ROW EXECUTE FUNCTION pgdrain.jobs_view_write();

-- A finished job now leaves active_jobs by DELETE: the per-queue running counts (0006, 0012) move
-- for deleted running rows as for updated ones.
CREATE OR REPLACE FUNCTION pgdrain.queue_limits_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE pgdrain.queue_limits IN ROW SHARE MODE;
    IF NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits) THEN
        RETURN NULL;  -- no limit configured: the common case costs one lookup
    END IF;
    IF TG_OP = 'DELETE' THEN
        WITH d AS (
            SELECT o.queue, -count(*)::int AS delta
            FROM old_rows AS o WHERE o.status = 'running'
            GROUP BY o.queue
        ), locked AS (
            SELECT l.queue FROM pgdrain.queue_limits AS l
            WHERE l.queue IN (SELECT d.queue FROM d)
            ORDER BY l.queue
            FOR UPDATE OF l
        )
        UPDATE pgdrain.queue_limits AS l
        SET running = greatest(0, l.running + d.delta)
        FROM d
        WHERE l.queue = d.queue AND l.queue IN (SELECT locked.queue FROM locked);
        RETURN NULL;
    END IF;
    WITH d AS (
        SELECT changes.queue, sum(changes.delta)::int AS delta
        FROM (
            SELECT n.queue, 1 AS delta FROM new_rows AS n WHERE n.status = 'running'
            UNION ALL
            SELECT o.queue, -1 FROM old_rows AS o WHERE o.status = 'running'
        ) AS changes
        GROUP BY changes.queue
        HAVING sum(changes.delta) <> 0
    ), locked AS (
        -- In queue order, as the claim locks them: two statements never wait on each other
        -- in opposite orders.
        SELECT l.queue FROM pgdrain.queue_limits AS l
        WHERE l.queue IN (SELECT d.queue FROM d)
        ORDER BY l.queue
        FOR UPDATE OF l
    )
    UPDATE pgdrain.queue_limits AS l
    SET running = greatest(0, l.running + d.delta)
    FROM d
    WHERE l.queue = d.queue AND l.queue IN (SELECT locked.queue FROM locked);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_queue_limits_count_delete
    AFTER DELETE ON pgdrain.active_jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.queue_limits_count();
