-- The statements of stats, jobs, jobs show, retry, cancel, purge, and the migration
-- ledger (db/store/operator_commands.py).
-- Statements pgdrain runs against the queue, each under a `-- name: NAME :SHAPE` line.
-- NAME is also the name of the pgdrain.db.store function that runs it (noun first, verb last, as
-- River names its queries). SHAPE is what the statement gives back: :one (at most one row),
-- :many (rows), :rowcount (only how many rows it changed), :exec (nothing).
-- Loaded once by pgdrain.db.sql; executed only by pgdrain.db.store.
-- Parameters are always bound (%(name)s); nothing here is ever formatted into a string.
-- Every statement after the claim is fenced by attempt_token: a fence condition stands on
-- a line of its own so that tests can derive the unfenced control from the real statement.

-- name: lock_timeout :exec
-- How long a migration (its own advisory lock, or a table a session holds) or a dashboard's
-- action (a job or a queue's row another transaction holds) waits for any lock, for this
-- transaction only (is_local = true: pooler-safe).
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: migration_lock :exec
-- Serialise concurrent `pgdrain migrate` runs; released when the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('pgdrain.migrate'));

-- name: migration_lock_holders :many
-- Who holds the migration lock (an advisory lock on a bigint key: classid holds its high 32
-- bits, objid its low 32 bits, objsubid 1).
SELECT l.pid, coalesce(a.usename, '?') AS role, coalesce(a.application_name, '') AS application
FROM pg_catalog.pg_locks AS l
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.granted
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND l.objsubid = 1
  AND l.classid::bigint = ((hashtext('pgdrain.migrate')::bigint >> 32) & 4294967295)
  AND l.objid::bigint = (hashtext('pgdrain.migrate')::bigint & 4294967295)
ORDER BY l.pid;

-- name: migration_ledger_exists :one
SELECT to_regclass('pgdrain.migrations') IS NOT NULL AS present;

-- name: migration_applied :many
SELECT version FROM pgdrain.migrations ORDER BY version;

-- name: migration_record :exec
INSERT INTO pgdrain.migrations (version) VALUES (%(version)s);

-- name: job_cancel_mark :exec
-- In the caller's transaction, around a cancel statement: a running job it cancels keeps its
-- queue's concurrency slot until its lease ends (the count trigger, migration 0040), as its
-- code may run until then. '' takes it back. Only sets a setting of the transaction: safe to
-- run twice.
SELECT pg_catalog.set_config('pgdrain.cancelling', %(value)s, true);

-- name: job_retry_mark :exec
-- In the caller's transaction, around a retry statement: the jobs it puts back into active_jobs
-- are queued again, not enqueued (jobs_flow_enqueued, migration 0029); '' takes it back. Only
-- sets a setting of the transaction: safe to run twice.
SELECT pg_catalog.set_config('pgdrain.queued_again', %(value)s, true);

-- name: job_retry :many
-- Operator action: put failed, parked or cancelled jobs back in the queue with a fresh set of
-- attempts. One row per job named that was in one of those states: `retried`, or `held_by`, the
-- job whose idempotency key it would take. A key is held by the queue's queued, running or
-- parked job that carries it (jobs_active_key_idx): a failed or cancelled job whose key is held
-- is not retried (the holder does its work); a parked job holds its own key; of several jobs
-- retried together with one key, the newest takes it and the others name it. A job neither
-- retried nor held changed state meanwhile (another operator retried or cancelled it).
-- A key taken by a transaction that commits while this statement runs makes it fail with a
-- unique violation: store.job_retry runs it again, and its new snapshot sees the holder.
-- A cancelled job with dependencies is not retried while one of them failed, was cancelled or
-- is no longer kept (`dependency`, with its status, NULL when gone): queued again it would be
-- cancelled at once, or wait for a job no run will finish. A failed or parked job ran, so its
-- dependencies were done: it is retried, and store.job_retry marks the transaction
-- (pgdrain.queued_again) so that those retention deleted since count as done (migration 0029).
-- A job cancelled while it ran is queued for when the cancelled attempt's lease ends, if that
-- is later (`lease_wait_until`): until then that attempt's code may still be running
-- (migration 0033).
-- Safe to run twice: a job queued again no longer matches.
WITH candidate AS (
    SELECT j.id, j.queue, j.kind, j.status, j.idempotency_key, j.depends_on,
           (SELECT f.cancelled_lease_expires_at
            FROM pgdrain.finished_jobs AS f
            WHERE f.id = j.id AND f.status = 'cancelled') AS cancelled_lease_expires_at
    FROM pgdrain.jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND j.status IN ('failed', 'parked', 'cancelled')
), judged AS (
    SELECT c.id, c.queue, c.kind, c.status,
           CASE WHEN c.idempotency_key IS NOT NULL AND c.status <> 'parked' THEN coalesce(
               (SELECT o.id FROM pgdrain.jobs AS o
                WHERE o.queue = c.queue
                  AND o.idempotency_key = c.idempotency_key
                  AND o.status IN ('queued', 'running', 'parked', 'waiting')),
               nullif(max(c.id) FILTER (WHERE c.status <> 'parked')
                          OVER (PARTITION BY c.queue, c.idempotency_key),
                      c.id))
           END AS held_by,
           ended.id AS dependency, ended.status AS dependency_status,
           -- The attempt a cancel cut short may run until its lease ends: not before.
           nullif(greatest(now(), c.cancelled_lease_expires_at), now()) AS lease_wait_until
    FROM candidate AS c
    LEFT JOIN LATERAL (
        SELECT d.id, j.status
        FROM unnest(c.depends_on) AS d(id)
        LEFT JOIN pgdrain.jobs AS j ON j.id = d.id
        WHERE c.status = 'cancelled'
          AND (j.id IS NULL OR j.status IN ('failed', 'cancelled'))
        ORDER BY d.id
        LIMIT 1
    ) AS ended ON true
), retried AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'queued', attempts = 0, run_at = coalesce(r.lease_wait_until, now()),
        finished_at = NULL, updated_at = now()
    FROM judged AS r
    WHERE j.id = r.id
      AND r.held_by IS NULL
      AND r.dependency IS NULL
      AND j.status IN ('failed', 'parked', 'cancelled')  -- never a row with a lease
      AND j.status = r.status  -- still in the state judged (a concurrent change is re-read)
    RETURNING j.id
)
-- A join, not `IN (SELECT ...)`: planned as a subplan, that rescanned the retried ids for
-- each job, O(jobs²) (a red team's 20,000 cancelled jobs took 22 s the same way).
SELECT r.id, r.queue, r.kind, r.held_by, d.id IS NOT NULL AS retried,
       r.dependency, r.dependency_status, r.lease_wait_until
FROM judged AS r
LEFT JOIN retried AS d ON d.id = r.id
ORDER BY r.id;

-- name: job_purge_finished :one
-- Delete one batch of finished jobs (%(statuses)s: done, failed, cancelled) that finished
-- more than %(days)s days ago, in one queue or all (%(queue)s NULL), from finished_jobs and from
-- the finished rows migration 0018 left in active_jobs. Returns how many went. Purge runs it
-- batch by batch; safe to run twice: a deleted row matches nothing.
WITH left_behind AS (
    DELETE FROM pgdrain.active_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.active_jobs
        WHERE status IN ('done', 'failed', 'cancelled')
          AND status = ANY(%(statuses)s::text[])
          AND finished_at < now() - %(days)s * interval '24 hours'
          AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
        LIMIT %(limit)s
    ))
      AND status IN ('done', 'failed', 'cancelled')
    RETURNING 1
), finished AS (
    -- Not a job cancelled while it ran whose lease has not ended: its row holds the queue's
    -- concurrency slot while the attempt's code may run (migration 0040), and tells that run
    -- the job was cancelled, not its lease lost.
    DELETE FROM pgdrain.finished_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.finished_jobs
        WHERE status = ANY(%(statuses)s::text[])
          AND finished_at < now() - %(days)s * interval '24 hours'
          AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
          AND NOT coalesce(cancelled_lease_expires_at > now(), false)
        LIMIT %(limit)s
    ))
      AND status = ANY(%(statuses)s::text[])
      AND finished_at < now() - %(days)s * interval '24 hours'
      AND NOT coalesce(cancelled_lease_expires_at > now(), false)
    RETURNING 1
)
SELECT (SELECT count(*) FROM left_behind) + (SELECT count(*) FROM finished) AS deleted;

-- name: finished_jobs_days_lock :exec
-- Purge's whole days, in one transaction: first the partition functions' lock (held to its end,
-- so that no retention drops a day between the count and the drop) and the limit on lock waits
-- (%(lock_timeout_ms)s): the drop's DETACH takes ACCESS EXCLUSIVE on the done jobs' table, and
-- completions queue behind it while it waits.
SELECT pg_catalog.set_config('lock_timeout', %(lock_timeout_ms)s::text, true),
       pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdrain.finished_jobs'));

-- name: finished_jobs_days_count :one
-- The done jobs in the day partitions whose whole UTC day ended more than %(days)s days ago:
-- those finished_jobs_days_drop drops (a row of such a day finished before the first midnight at
-- or before now() less the days). The default partition's are deleted by rows, not here.
-- Read through finished_jobs, as a role granted only that table reads it.
SELECT count(*) AS jobs
FROM pgdrain.finished_jobs AS d
WHERE d.status = 'done'
  AND d.finished_at < (date_trunc('day', (now() - %(days)s * interval '24 hours') AT TIME ZONE 'UTC')
                       AT TIME ZONE 'UTC')
  AND d.tableoid <> 'pgdrain.finished_jobs_done_default'::regclass;

-- name: finished_jobs_days_drop :one
-- Drop the day partitions finished_jobs_days_count counted (DETACH and DROP, a catalog change
-- each, however many rows). Safe to run twice: a dropped day is gone.
SELECT pgdrain.finished_jobs_partition_drop(%(days)s::float8) AS dropped;

-- name: job_list :many
-- The newest jobs matching the filters; a NULL filter matches every job. --since compares
-- updated_at: the job's last change of state (enqueued, claimed, failed, finished...).
-- %(before)s pages: only jobs older than that id (the dashboard's next page; NULL: the newest).
-- due_in_s: seconds until run_at on the database's clock (a queued job waits while above 0).
-- A run_at no client can read (`infinity`, a year past 9999: a finished row written before
-- migration 0025, which refuses them) is listed as NULL, as is its due_in_s. progress and
-- output as text, decoded by the store as job_show's values are, only when %(values)s: a list
-- that shows neither (the dashboard's) reads no output, which may be megabytes a job.
SELECT id, queue, kind, status, priority, attempts, max_attempts, reclaim_count,
       CASE WHEN run_at > '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00'
            THEN run_at END AS run_at,
       lease_expires_at, created_at, updated_at, finished_at, last_error,
       CASE WHEN run_at > '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00'
            THEN extract(epoch FROM run_at - now())::float8 END AS due_in_s,
       sequence, depends_on,
       CASE WHEN %(values)s::boolean THEN progress::text END AS progress,
       CASE WHEN %(values)s::boolean THEN output::text END AS output
FROM pgdrain.jobs
WHERE status = ANY(%(statuses)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
  AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_list_finished :many
-- job_list for one status of finished rows (%(status)s: done, failed, parked or cancelled), in one
-- queue or all, without the kind and since filters: the ids of the newest of each queue from
-- jobs_finished_queue_idx (queue, status, id), one backward range per queue read from the index
-- alone, the newest of those, then their rows by primary key. The queues are found by skipping
-- through the same index, one probe each (as queue_stats). Read from the table instead, ordered
-- by id, a page walks every newer row of other statuses first: a backlog of queued jobs, or the
-- whole table when no job has that status.
WITH RECURSIVE finished_queue AS (
    (SELECT queue FROM pgdrain.jobs
     WHERE status IN ('done', 'failed', 'parked', 'cancelled')
     ORDER BY queue
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgdrain.jobs AS j
            WHERE j.status IN ('done', 'failed', 'parked', 'cancelled')
              AND j.queue > f.queue
            ORDER BY j.queue
            LIMIT 1)
    FROM finished_queue AS f
    WHERE f.queue IS NOT NULL
)
-- run_at and due_in_s as job_list gives them (a unit test keeps the two in step).
SELECT id, queue, kind, status, priority, attempts, max_attempts, reclaim_count,
       CASE WHEN run_at > '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00'
            THEN run_at END AS run_at,
       lease_expires_at, created_at, updated_at, finished_at, last_error,
       CASE WHEN run_at > '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00'
            THEN extract(epoch FROM run_at - now())::float8 END AS due_in_s,
       sequence, depends_on,
       CASE WHEN %(values)s::boolean THEN progress::text END AS progress,
       CASE WHEN %(values)s::boolean THEN output::text END AS output
FROM pgdrain.jobs
WHERE id = ANY(ARRAY(
    SELECT page.id
    FROM finished_queue AS f
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM pgdrain.jobs AS j
        WHERE j.status IN ('done', 'failed', 'parked', 'cancelled')
          AND j.queue = f.queue
          AND j.status = %(status)s::text
          AND (%(before)s::bigint IS NULL OR j.id < %(before)s::bigint)
        ORDER BY j.id DESC
        LIMIT %(limit)s
    ) AS page
    WHERE f.queue IS NOT NULL
      AND (%(queue)s::text IS NULL OR f.queue = %(queue)s::text)
    ORDER BY page.id DESC
    LIMIT %(limit)s
))
ORDER BY id DESC;

-- name: queue_stats :many
-- Counts per queue and status, the age of the oldest ready job, and running jobs whose
-- lease has expired (non-zero for long means reclaim is not running). queued, ready, delayed,
-- running, waiting and expired_leases are exact, read from the partial indexes of queued,
-- running and waiting rows (their cost grows with the backlog, not the history). done, failed, parked and
-- cancelled are exact up to 10,000 per queue and read as 10000 above that: counting a history
-- of millions of rows each time is what made stats slow, so each count stops at the bound
-- (index scans of each finished_jobs partition's (queue, status, id) index, and of
-- jobs_finished_queue_idx for parked jobs, which stay in active_jobs). The queues that only
-- have history are found by skipping through the same indexes, one probe per queue.
WITH RECURSIVE finished_queue AS (
    (SELECT queue FROM pgdrain.jobs
     WHERE status IN ('done', 'failed', 'parked', 'cancelled')
     ORDER BY queue
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgdrain.jobs AS j
            WHERE j.status IN ('done', 'failed', 'parked', 'cancelled')
              AND j.queue > f.queue
            ORDER BY j.queue
            LIMIT 1)
    FROM finished_queue AS f
    WHERE f.queue IS NOT NULL
), finished AS (
    SELECT f.queue,
           (SELECT count(*) FROM (SELECT 1 FROM pgdrain.jobs AS j
                                  WHERE j.status = 'done' AND j.queue = f.queue
                                  LIMIT 10000) AS bounded) AS done,
           (SELECT count(*) FROM (SELECT 1 FROM pgdrain.jobs AS j
                                  WHERE j.status = 'failed' AND j.queue = f.queue
                                  LIMIT 10000) AS bounded) AS failed,
           (SELECT count(*) FROM (SELECT 1 FROM pgdrain.jobs AS j
                                  WHERE j.status = 'parked' AND j.queue = f.queue
                                  LIMIT 10000) AS bounded) AS parked,
           (SELECT count(*) FROM (SELECT 1 FROM pgdrain.jobs AS j
                                  WHERE j.status = 'cancelled' AND j.queue = f.queue
                                  LIMIT 10000) AS bounded) AS cancelled
    FROM finished_queue AS f
    WHERE f.queue IS NOT NULL
), queued AS (
    SELECT queue,
           count(*) AS queued,
           count(*) FILTER (WHERE run_at <= now()) AS ready,
           count(*) FILTER (WHERE run_at > now()) AS delayed,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready_at
    FROM pgdrain.jobs
    WHERE status = 'queued'
    GROUP BY queue
), running AS (
    SELECT queue,
           count(*) AS running,
           count(*) FILTER (WHERE lease_expires_at < now()) AS expired_leases
    FROM pgdrain.jobs
    WHERE status = 'running'
    GROUP BY queue
), waiting AS (
    -- Held back by a sequence or by dependencies (jobs_waiting_queue_idx).
    SELECT queue, count(*) AS waiting
    FROM pgdrain.active_jobs
    WHERE status = 'waiting'
    GROUP BY queue
), paused AS (
    -- Paused queues (pgdrain.queue_pause), listed also when they hold no job.
    SELECT queue FROM pgdrain.queue_limits WHERE paused_at IS NOT NULL
)
SELECT coalesce(queued.queue, running.queue, finished.queue, waiting.queue, paused.queue) AS queue,
       coalesce(queued.queued, 0)                             AS queued,
       coalesce(queued.ready, 0)                              AS ready,
       coalesce(queued.delayed, 0)                            AS delayed,
       coalesce(running.running, 0)                           AS running,
       coalesce(finished.done, 0)                             AS done,
       coalesce(finished.failed, 0)                           AS failed,
       coalesce(finished.parked, 0)                           AS parked,
       coalesce(finished.cancelled, 0)                        AS cancelled,
       coalesce(extract(epoch FROM now() - queued.oldest_ready_at), 0)::float8
                                                              AS oldest_ready_age_s,
       coalesce(running.expired_leases, 0)                    AS expired_leases,
       paused.queue IS NOT NULL                               AS paused,
       coalesce(waiting.waiting, 0)                           AS waiting
FROM queued
FULL JOIN running ON running.queue = queued.queue
FULL JOIN finished ON finished.queue = coalesce(queued.queue, running.queue)
FULL JOIN waiting ON waiting.queue = coalesce(queued.queue, running.queue, finished.queue)
FULL JOIN paused
    ON paused.queue = coalesce(queued.queue, running.queue, finished.queue, waiting.queue)
ORDER BY 1;

-- name: job_show :one
-- Every column of one job, as JSON (so a column added by a later migration, such as the
-- error history, shows without changing this statement). The values a job or plain SQL
-- writes (payload, output, progress, errors) come apart, as text: store.job_show decodes
-- each on its own, so one Python cannot hold leaves the rest readable. NULL: no such column.
SELECT j.job - 'payload' - 'output' - 'progress' - 'errors' AS job,
       (j.job -> 'payload')::text AS payload,
       (j.job -> 'output')::text AS output,
       (j.job -> 'progress')::text AS progress,
       (j.job -> 'errors')::text AS errors
FROM (SELECT to_jsonb(t) AS job FROM pgdrain.jobs AS t WHERE t.id = %(id)s) AS j;

-- name: job_dependency_outputs :many
-- The output each dependency of this job recorded (NULL: none, not done, or its row is gone
-- to retention or purge), by primary key. Every id of depends_on has a row.
SELECT dep.id, d.status, d.output
FROM pgdrain.jobs AS j
CROSS JOIN LATERAL unnest(j.depends_on) AS dep(id)
LEFT JOIN pgdrain.jobs AS d ON d.id = dep.id
WHERE j.id = %(id)s
ORDER BY dep.id;

-- name: job_retry_matching :many
-- Operator action by filter: queue again the jobs in %(statuses)s (failed, parked) matching
-- the filters (a NULL filter matches every job), with a fresh set of attempts. What it returns,
-- and how idempotency keys are kept, as job_retry (the same statement from `judged` on: a unit
-- test keeps them in step). `--dry-run` runs it in a transaction that is rolled back. Safe to
-- run twice: a job queued again no longer matches.
WITH candidate AS (
    SELECT j.id, j.queue, j.kind, j.status, j.idempotency_key, j.depends_on,
           NULL::timestamptz AS cancelled_lease_expires_at  -- no cancelled job here
    FROM pgdrain.jobs AS j
    WHERE j.status IN ('failed', 'parked')
      AND j.status = ANY(%(statuses)s::text[])
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
      AND (%(since)s::timestamptz IS NULL OR j.updated_at >= %(since)s::timestamptz)
), judged AS (
    SELECT c.id, c.queue, c.kind, c.status,
           CASE WHEN c.idempotency_key IS NOT NULL AND c.status <> 'parked' THEN coalesce(
               (SELECT o.id FROM pgdrain.jobs AS o
                WHERE o.queue = c.queue
                  AND o.idempotency_key = c.idempotency_key
                  AND o.status IN ('queued', 'running', 'parked', 'waiting')),
               nullif(max(c.id) FILTER (WHERE c.status <> 'parked')
                          OVER (PARTITION BY c.queue, c.idempotency_key),
                      c.id))
           END AS held_by,
           ended.id AS dependency, ended.status AS dependency_status,
           -- The attempt a cancel cut short may run until its lease ends: not before.
           nullif(greatest(now(), c.cancelled_lease_expires_at), now()) AS lease_wait_until
    FROM candidate AS c
    LEFT JOIN LATERAL (
        SELECT d.id, j.status
        FROM unnest(c.depends_on) AS d(id)
        LEFT JOIN pgdrain.jobs AS j ON j.id = d.id
        WHERE c.status = 'cancelled'
          AND (j.id IS NULL OR j.status IN ('failed', 'cancelled'))
        ORDER BY d.id
        LIMIT 1
    ) AS ended ON true
), retried AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'queued', attempts = 0, run_at = coalesce(r.lease_wait_until, now()),
        finished_at = NULL, updated_at = now()
    FROM judged AS r
    WHERE j.id = r.id
      AND r.held_by IS NULL
      AND r.dependency IS NULL
      AND j.status IN ('failed', 'parked', 'cancelled')  -- never a row with a lease
      AND j.status = r.status  -- still in the state judged (a concurrent change is re-read)
    RETURNING j.id
)
-- A join, not `IN (SELECT ...)`: planned as a subplan, that rescanned the retried ids for
-- each job, O(jobs²) (a red team's 20,000 cancelled jobs took 22 s the same way).
SELECT r.id, r.queue, r.kind, r.held_by, d.id IS NOT NULL AS retried,
       r.dependency, r.dependency_status, r.lease_wait_until
FROM judged AS r
LEFT JOIN retried AS d ON d.id = r.id
ORDER BY r.id;

-- name: job_retry_matching_preview :many
-- What job_retry_matching would do, read without a change (the dashboard asks first with it):
-- the same candidates judged the same way (a unit test keeps the two in step up to `retried`),
-- a job queued again when no key is held and no dependency ended. Returns at most %(shown)s of
-- the jobs it would queue again and %(shown)s of those it would not, by id, each row with the
-- two counts: however many match, only a page of them is sent.
WITH candidate AS (
    SELECT j.id, j.queue, j.kind, j.status, j.idempotency_key, j.depends_on,
           NULL::timestamptz AS cancelled_lease_expires_at  -- no cancelled job here
    FROM pgdrain.jobs AS j
    WHERE j.status IN ('failed', 'parked')
      AND j.status = ANY(%(statuses)s::text[])
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
      AND (%(since)s::timestamptz IS NULL OR j.updated_at >= %(since)s::timestamptz)
), judged AS (
    SELECT c.id, c.queue, c.kind, c.status,
           CASE WHEN c.idempotency_key IS NOT NULL AND c.status <> 'parked' THEN coalesce(
               (SELECT o.id FROM pgdrain.jobs AS o
                WHERE o.queue = c.queue
                  AND o.idempotency_key = c.idempotency_key
                  AND o.status IN ('queued', 'running', 'parked', 'waiting')),
               nullif(max(c.id) FILTER (WHERE c.status <> 'parked')
                          OVER (PARTITION BY c.queue, c.idempotency_key),
                      c.id))
           END AS held_by,
           ended.id AS dependency, ended.status AS dependency_status,
           -- The attempt a cancel cut short may run until its lease ends: not before.
           nullif(greatest(now(), c.cancelled_lease_expires_at), now()) AS lease_wait_until
    FROM candidate AS c
    LEFT JOIN LATERAL (
        SELECT d.id, j.status
        FROM unnest(c.depends_on) AS d(id)
        LEFT JOIN pgdrain.jobs AS j ON j.id = d.id
        WHERE c.status = 'cancelled'
          AND (j.id IS NULL OR j.status IN ('failed', 'cancelled'))
        ORDER BY d.id
        LIMIT 1
    ) AS ended ON true
), counted AS (
    SELECT r.id, r.queue, r.kind, r.held_by,
           r.held_by IS NULL AND r.dependency IS NULL AS retried,
           r.dependency, r.dependency_status, r.lease_wait_until
    FROM judged AS r
), numbered AS (
    SELECT c.*,
           row_number() OVER (PARTITION BY c.retried ORDER BY c.id) AS nth,
           count(*) FILTER (WHERE c.retried) OVER () AS would_retry,
           count(*) FILTER (WHERE c.held_by IS NOT NULL) OVER () AS key_held
    FROM counted AS c
)
SELECT n.id, n.queue, n.kind, n.held_by, n.retried,
       n.dependency, n.dependency_status, n.lease_wait_until, n.would_retry, n.key_held
FROM numbered AS n
WHERE n.nth <= %(shown)s
ORDER BY n.id;

-- name: job_cancel :many
-- Operator action: a queued, waiting or parked job never runs; a running one loses its lease (status
-- and token change), so its run's heartbeat reports it lost, job.lease_lost() turns true and
-- the fenced completion or failure of that attempt is refused. Returns each job it locked with
-- the status it had, and whether it was cancelled: one that changed between the statement's
-- snapshot and its lock (a claim, a failed attempt queued again, a release) was not, as the
-- view writes a row only as the statement read it. store.job_cancel runs the statement again
-- in the same transaction, which holds those locks, so the second time they are cancelled.
-- Safe to run twice: a cancelled job no longer matches.
WITH target AS (
    SELECT id, status
    FROM pgdrain.active_jobs
    WHERE id = ANY(%(ids)s::bigint[])
      AND status IN ('queued', 'running', 'parked', 'waiting')
    FOR UPDATE
), cancelled AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'cancelled',
        lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
        finished_at = now(),
        updated_at = now()
    FROM target
    WHERE j.id = target.id
    RETURNING j.id
)
-- A join, not `IN (SELECT ...)`: planned as a subplan, that rescanned the cancelled ids for
-- each job, O(jobs²) (a red team's 20,000 jobs cancelled by filter took 22 s).
SELECT t.id, t.status AS was, c.id IS NOT NULL AS cancelled
FROM target AS t
LEFT JOIN cancelled AS c ON c.id = t.id;

-- name: job_cancel_matching :many
-- Operator action by filter: cancel the jobs in %(statuses)s (queued, running, parked, waiting)
-- matching the filters (a NULL filter matches every job), as job_cancel does, and returns
-- what it does (with each job's queue and kind). `--dry-run` runs it in a transaction that is
-- rolled back. Safe to run twice: a cancelled job no longer matches.
WITH target AS (
    SELECT id, queue, kind, status
    FROM pgdrain.active_jobs
    WHERE status IN ('queued', 'running', 'parked', 'waiting')
      AND status = ANY(%(statuses)s::text[])
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
      AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
    FOR UPDATE
), cancelled AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'cancelled',
        lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
        finished_at = now(),
        updated_at = now()
    FROM target
    WHERE j.id = target.id
    RETURNING j.id
)
-- A join, as job_cancel says.
SELECT t.id, t.queue, t.kind, t.status AS was, c.id IS NOT NULL AS cancelled
FROM target AS t
LEFT JOIN cancelled AS c ON c.id = t.id;

-- name: job_count_finished :one
-- What job_purge_finished would delete, counted (purge --dry-run): the same conditions.
SELECT count(*) AS jobs
FROM pgdrain.jobs AS j
WHERE j.status IN ('done', 'failed', 'cancelled')
  AND j.status = ANY(%(statuses)s::text[])
  AND j.finished_at < now() - %(days)s * interval '24 hours'
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND NOT EXISTS (SELECT 1 FROM pgdrain.finished_jobs AS f
                  WHERE f.id = j.id AND f.cancelled_lease_expires_at > now());

-- name: job_queues :many
-- The queues of these jobs, once each: the queues `pgdrain retry` kicks after its commit.
SELECT DISTINCT queue FROM pgdrain.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY queue;
-- The dashboard's reads (pgdrain ui) that the commands above do not make. Each is bounded.

-- name: operator_session :one
-- The first statement on an operator's connection (the CLI's commands, each dashboard request):
-- timestamps come back in ISO, the one DateStyle psycopg reads, whatever the database's or
-- role's own (`SQL, DMY`, `German`). For the session (`false`): behind PgBouncer too, which keeps
-- DateStyle per client. The drain sets it with its own limits (session_limits). Returns
-- session_replication_role: under `replica` the triggers that move a job (the view's), release
-- its dependents and count a queue's running jobs do not fire (store.operator_session refuses).
SELECT pg_catalog.set_config('DateStyle', 'ISO', false),
       pg_catalog.current_setting('session_replication_role');

-- name: operator_read_timeout :exec
-- Bound the dashboard's reads until the transaction ends (is_local: pooler-safe): a filter no
-- index serves (a kind, a time) on a long history gives up instead of reading it all. Its retry
-- by filter too, by the invocation's time left: stopped and rolled back, not cut off unsaid.
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true);

-- name: job_finished_per_minute :many
-- Done, failed and cancelled jobs per minute and queue, since %(since)s, counted from the newest
-- %(limit)s finished jobs at most (newest by id: the history keeps no b-tree by finished_at, one
-- entry more for every job to write): a backward walk of the id indexes that stops at the bound,
-- however busy the queues were, through the day partitions that hold %(since)s and later only.
-- When the bound is reached, the minutes before the oldest one counted are not (the caller says
-- so, from the total).
WITH recent AS (
    SELECT queue, status, finished_at
    FROM pgdrain.jobs
    WHERE status IN ('done', 'failed', 'cancelled')
      AND finished_at >= %(since)s::timestamptz
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT date_trunc('minute', finished_at) AS minute, queue,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled
FROM recent
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: run_list :many
-- The runs the control plane knows of (pgdrain.runs: registered or reserved, deleted when they
-- exit), newest first; `live` while their deadline has not passed (a run past it was killed).
SELECT run_id, queues, chain, started_at, deadline, deadline > now() AS live,
       extract(epoch FROM now() - started_at)::float8 AS age_s
FROM pgdrain.runs
ORDER BY started_at DESC, run_id
LIMIT %(limit)s;

-- name: run_history_list :many
-- The runs that ended (pgdrain.run_history, written by each run's exit), newest first, at most
-- %(limit)s: along run_history_finished_at_idx, backwards.
SELECT run_id, "trigger", queues, chain, started_at, finished_at,
       extract(epoch FROM finished_at - started_at)::float8 AS duration_s,
       stop_reason, claimed, done, retried, failed, cancelled, lease_lost, reclaimed, released,
       drained_again, lingered, continued
FROM pgdrain.run_history
ORDER BY finished_at DESC, run_id
LIMIT %(limit)s;

-- name: runs_keep_done :one
-- Whether the newest run whose line says kept its done jobs (migration 0027): false when it ran
-- with PGDRAIN_RETAIN_DONE=0. No row when no line says (no run yet, or only lines written before
-- 0027). Along run_history_finished_at_idx, backwards, to the first line that says.
SELECT done_kept
FROM pgdrain.run_history
WHERE done_kept IS NOT NULL
ORDER BY finished_at DESC
LIMIT 1;

-- name: wake_list :many
-- Wake-ups (one-shot schedules) recorded per set of queues, the soonest first: `pending` while
-- still to come.
SELECT queue_set, wake_at, state, wake_at > now() AS pending,
       extract(epoch FROM wake_at - now())::float8 AS in_s
FROM pgdrain.wakes
ORDER BY wake_at, queue_set
LIMIT %(limit)s;

-- name: kick_list :many
-- Each queue's kicks: when one was last asked for and last invoked (NULL: never; the table
-- keeps '-infinity'), and until when a run holds them (a kick then invokes nothing).
SELECT queue,
       nullif(requested_at, '-infinity') AS requested_at,
       nullif(kicked_at, '-infinity') AS kicked_at,
       CASE WHEN run_until > now() THEN run_until END AS held_until
FROM pgdrain.kicks
ORDER BY queue
LIMIT %(limit)s;

-- name: queue_limit_list :many
-- The per-queue settings in force: concurrency limits and rates (PGDRAIN_QUEUE_LIMITS, NULL
-- when not set) with the running count and the claims of the current rate window, and pauses.
SELECT queue, max_running, running, rate_limit, rate_seconds,
       CASE WHEN window_start >= pgdrain.rate_window(rate_seconds) THEN window_started ELSE 0
       END AS window_started,
       paused_at
FROM pgdrain.queue_limits
ORDER BY queue
LIMIT %(limit)s;

-- name: queue_pause :one
-- Pause a queue (pgdrain.queue_pause, migration 0020): returns when it was paused, the first
-- pause's time if it was already. Safe to repeat.
SELECT pgdrain.queue_pause(%(queue)s::text) AS paused_at;

-- name: queue_resume :one
-- Resume a queue (pgdrain.queue_resume): returns whether it was paused. Safe to repeat.
SELECT pgdrain.queue_resume(%(queue)s::text) AS was_paused;
