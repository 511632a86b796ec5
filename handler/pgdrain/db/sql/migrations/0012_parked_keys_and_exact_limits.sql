-- pgdrain 0012: a parked job holds its idempotency key, and a per-queue limit's running count is
-- exact however its row is created, and corrected when it holds back ready work.

-- 1. Idempotency keys: held by queued, running and parked jobs; freed by done, failed and
-- cancelled (as River's unique states leave out cancelled and discarded jobs). A parked job's
-- run died during an attempt whose work may have happened, and a person decides whether it runs
-- again (`pgdrain retry`, which keeps the key with it): a new job with its key would do that
-- work a second time. Until now a parked job freed its key, so a job enqueued since may share
-- it. Where jobs share a key, the queued or running one keeps it, else the newest parked one; a
-- parked job that yields is cancelled (retried by id once the key is free), with a line saying why.
WITH keeper AS (
    SELECT DISTINCT ON (queue, idempotency_key) id, queue, idempotency_key
    FROM pgdrain.jobs
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running', 'parked')
    ORDER BY queue, idempotency_key, status = 'parked', id DESC
)
UPDATE pgdrain.jobs AS j
SET status = 'cancelled',
    finished_at = now(),
    updated_at = now(),
    last_error = 'cancelled by migration 0012: parked, its idempotency key is held by job '
                 || k.id || ' (retry it once that job is finished); before: '
                 || coalesce(j.last_error, '')
FROM keeper AS k
WHERE j.status = 'parked'
  AND j.queue = k.queue
  AND j.idempotency_key = k.idempotency_key
  AND j.id <> k.id;

DROP INDEX pgdrain.jobs_active_key_idx;
CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running', 'parked');

-- 2. Per-queue limits. The count trigger (0006) moves a queue's `running` from each statement's
-- transition tables; a statement that ran it before the queue's row existed moved nothing, and
-- a row counted from a snapshot taken before that statement committed is wrong for good: too
-- high when an attempt ended (the queue stops once it reaches its limit), too low when one was
-- claimed (the limit is exceeded). So the trigger now takes ROW SHARE on the table, in a
-- statement of its own before it reads it (held to the end of its transaction), and a row is
-- created under EXCLUSIVE (queue_limits_sync): that waits for every transaction that ran the
-- trigger or a claim (which locks the table's rows) and holds back every later one until the
-- row is committed (a statement takes its table locks before its snapshot, so one that waited
-- sees the row), and the count, a statement of its own after the lock, sees them all.
CREATE OR REPLACE FUNCTION pgdrain.queue_limits_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE pgdrain.queue_limits IN ROW SHARE MODE;
    IF NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits) THEN
        RETURN NULL;  -- no limit configured: the common case costs one lookup
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

-- Make the limits of `queues` what `limited` and `limits` say (PGDRAIN_QUEUE_LIMITS): change
-- the limits given, drop the others, create the missing rows from a count of the queue's
-- running jobs, under EXCLUSIVE (above). The lock is asked for before anything is written, so
-- two syncs never wait on each other's writes. While it is waited for, every statement that
-- moves jobs waits behind it: a lock not granted within wait_ms (nor the caller's own
-- lock_timeout) leaves the missing rows to the next run, with a WARNING in the server's log.
-- Safe to repeat: it writes the same values again. READ COMMITTED (as every drain's
-- transaction): each statement here reads a snapshot of its own.
CREATE FUNCTION pgdrain.queue_limits_sync(
    queues text[], limited text[], limits integer[], wait_ms integer
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    missing boolean;
    kept text;
    kept_ms integer;
BEGIN
    missing := EXISTS (
        SELECT 1 FROM unnest(limited) AS w(queue)
        WHERE NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l WHERE l.queue = w.queue)
    );
    IF missing THEN
        kept := current_setting('lock_timeout');
        kept_ms := (SELECT s.setting::integer FROM pg_catalog.pg_settings AS s
                    WHERE s.name = 'lock_timeout');
        BEGIN
            IF kept_ms = 0 OR kept_ms > wait_ms THEN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            END IF;
            LOCK TABLE pgdrain.queue_limits IN EXCLUSIVE MODE;
        EXCEPTION WHEN lock_not_available THEN
            missing := false;
            RAISE WARNING 'pgdrain: the limits of queues % were not created: the lock on '
                'pgdrain.queue_limits was not granted within % ms; the next run tries again',
                limited, least(wait_ms, nullif(kept_ms, 0));
        END;
        PERFORM set_config('lock_timeout', kept, true);
    END IF;
    DELETE FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited);
    IF missing THEN
        INSERT INTO pgdrain.queue_limits AS l (queue, max_running, running)
        SELECT w.queue, w.max_running,
               (SELECT count(*) FROM pgdrain.jobs AS j
                WHERE j.status = 'running' AND j.queue = w.queue)
        FROM unnest(limited, limits) AS w(queue, max_running)
        ON CONFLICT (queue) DO UPDATE SET max_running = excluded.max_running
        WHERE l.max_running <> excluded.max_running;
    ELSE
        -- Without the lock nothing is created: a row dropped meanwhile waits for the next run.
        UPDATE pgdrain.queue_limits AS l SET max_running = w.max_running
        FROM unnest(limited, limits) AS w(queue, max_running)
        WHERE l.queue = w.queue AND l.max_running <> w.max_running;
    END IF;
END
$$;

-- Recount the running jobs of these queues' limit rows, and correct the rows whose count is
-- wrong; returns them (queue, the count it had, the exact count). The rows are locked first,
-- in queue order as every statement locks them: each transaction that moved a count holds its
-- row until it ends, so once the rows are ours every such transaction has committed, or waits
-- and applies its change after ours. The count is a statement of its own, after the lock, so
-- its snapshot sees each one that committed. READ COMMITTED, as queue_limits_sync.
CREATE FUNCTION pgdrain.queue_limits_recount(queues text[])
RETURNS TABLE (queue text, was integer, running integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(queues)
    ORDER BY l.queue
    FOR UPDATE OF l;
    RETURN QUERY
    WITH exact AS (
        SELECT l.queue, l.running AS was,
               (SELECT count(*) FROM pgdrain.jobs AS j
                WHERE j.status = 'running' AND j.queue = l.queue)::integer AS n
        FROM pgdrain.queue_limits AS l
        WHERE l.queue = ANY(queues)
    )
    UPDATE pgdrain.queue_limits AS l SET running = e.n
    FROM exact AS e
    WHERE l.queue = e.queue AND l.running <> e.n
    RETURNING l.queue, e.was, l.running;
END
$$;
