-- Every statement pgdrain runs against the queue, each under a `-- name: NAME :SHAPE` line.
-- NAME is also the name of the pgdrain.store function that runs it (noun first, verb last, as
-- River names its queries). SHAPE is what the statement gives back: :one (at most one row),
-- :many (rows), :rowcount (only how many rows it changed), :exec (nothing).
-- Loaded once by pgdrain.sql; executed only by pgdrain.store.
-- Parameters are always bound (%(name)s); nothing here is ever formatted into a string.
-- Every statement after the claim is fenced by attempt_token: a fence condition stands on
-- a line of its own so that tests can derive the unfenced control from the real statement.

-- name: migration_lock_timeout :exec
-- How long the migration waits for any lock (its own advisory lock, or a table a session
-- holds), for this transaction only (is_local = true: pooler-safe).
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

-- name: job_insert :one
-- One job. A key held by an unfinished job of the same queue inserts nothing, no row. Every
-- parameter carries its type (CAST, not `::`, which SQLAlchemy's `:name` binds would misread),
-- so any driver can run this statement with plain values, the payload as JSON text:
-- pgdrain.enqueue_statement hands it to applications on other drivers.
INSERT INTO pgdrain.jobs
    (queue, kind, payload, priority, run_at, max_attempts, recovery_policy, idempotency_key)
VALUES
    (CAST(%(queue)s AS text), CAST(%(kind)s AS text), CAST(%(payload)s AS jsonb),
     CAST(%(priority)s AS int),
     coalesce(CAST(%(run_at)s AS timestamptz),
              now() + make_interval(secs => CAST(%(delay_seconds)s AS float8))),
     CAST(%(max_attempts)s AS int), CAST(%(recovery_policy)s AS text),
     CAST(%(idempotency_key)s AS text))
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
RETURNING id;

-- name: periodic_enqueue :many
-- The due slot of each periodic kind, enqueued only if later than the slot last enqueued for
-- that kind (periodic_slots; concurrent runs serialise on its row, so one of them wins): a
-- slot is enqueued once, and a second run, or a repeat of this statement after a reconnect,
-- enqueues nothing. Returns the ids of the jobs created.
WITH due AS (
    SELECT *
    FROM unnest(%(kinds)s::text[], %(slots)s::timestamptz[], %(queues)s::text[],
                %(payloads)s::jsonb[], %(priorities)s::int[], %(max_attempts)s::int[],
                %(recovery_policies)s::text[])
         AS d(kind, slot, queue, payload, priority, max_attempts, recovery_policy)
), taken AS (
    INSERT INTO pgdrain.periodic_slots AS p (kind, slot)
    SELECT kind, slot FROM due
    ON CONFLICT (kind) DO UPDATE SET slot = excluded.slot, enqueued_at = now()
    WHERE p.slot < excluded.slot
    RETURNING p.kind
)
INSERT INTO pgdrain.jobs (queue, kind, payload, priority, max_attempts, recovery_policy)
SELECT due.queue, due.kind, due.payload, due.priority, due.max_attempts, due.recovery_policy
FROM due
JOIN taken ON taken.kind = due.kind
RETURNING id;

-- name: job_find_by_key :one
-- The unfinished job of this queue that holds the key (at most one: jobs_active_key_idx).
SELECT id FROM pgdrain.jobs
WHERE queue = %(queue)s
  AND idempotency_key = %(idempotency_key)s
  AND status IN ('queued', 'running');

-- name: job_insert_many :many
-- Many jobs in one statement; rows whose idempotency key exists already are skipped.
INSERT INTO pgdrain.jobs
    (queue, kind, payload, priority, run_at, max_attempts, recovery_policy, idempotency_key)
SELECT t.queue, t.kind, t.payload, t.priority,
       coalesce(t.run_at, now() + make_interval(secs => t.delay_seconds)),
       t.max_attempts, t.recovery_policy, t.idempotency_key
FROM unnest(
    %(queues)s::text[], %(kinds)s::text[], %(payloads)s::jsonb[], %(priorities)s::int[],
    %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::int[],
    %(recovery_policies)s::text[], %(idempotency_keys)s::text[]
) AS t(queue, kind, payload, priority, run_at, delay_seconds, max_attempts,
       recovery_policy, idempotency_key)
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
RETURNING id;

-- name: job_extend_leases :many
-- Heartbeat for every job a run holds, in one statement. A job not returned has lost its lease.
UPDATE pgdrain.jobs AS j
SET lease_expires_at = now() + least(make_interval(secs => %(lease_seconds)s),
                                     make_interval(secs => %(cap_seconds)s)),
    heartbeat_at = now(),
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS held(id, token)
WHERE j.id = held.id
  AND j.status = 'running'
  AND j.attempt_token = held.token
RETURNING j.id;

-- name: job_complete_and_claim :many
-- The drain's one round trip: mark the jobs this run finished done, then claim up to
-- %(limit)s ready jobs in priority order. SKIP LOCKED lets concurrent drains pass each other.
-- A finished job not returned as completed had lost its lease: its result is not recorded,
-- and completed_token keeps the token of the attempt whose result was. A claimed lease never
-- reaches past the run's deadline (cap_seconds; NULL = no cap), measured on the database's
-- clock. One statement, so one commit, for both.
WITH completed AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'done',
        completed_token = held.token,
        lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
        last_error = NULL,
        finished_at = now(),
        updated_at = now()
    FROM unnest(%(done_ids)s::bigint[], %(done_tokens)s::uuid[]) AS held(id, token)
    WHERE j.id = held.id
      AND j.status = 'running'
      AND j.attempt_token = held.token
    RETURNING j.id
), ready AS (
    -- Per queue, so that each scan walks jobs_ready_idx in order and stops at the limit
    -- (`queue = ANY(...)` would sort every ready row first).
    SELECT candidate.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    -- A queue with nothing ready is passed over after one probe of jobs_queued_run_at_idx;
    -- without it the scan below walks every delayed row of the queue before finding nothing
    -- (the run's last, empty claim).
    CROSS JOIN LATERAL (
        SELECT 1 FROM pgdrain.jobs
        WHERE status = 'queued'
          AND queue = q.name
          AND run_at <= now()
        ORDER BY run_at
        LIMIT 1
    ) AS has_ready
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at
        FROM pgdrain.jobs
        WHERE status = 'queued'
          AND queue = q.name
          AND run_at <= now()
        ORDER BY priority, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS candidate
    ORDER BY candidate.priority, candidate.run_at, candidate.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        attempt_token = gen_random_uuid(),
        leased_by = %(worker)s,
        heartbeat_at = now(),
        lease_expires_at = now() + least(make_interval(secs => %(lease_seconds)s),
                                         make_interval(secs => %(cap_seconds)s)),
        updated_at = now()
    -- An array of ids keeps the primary-key lookup; joining `ready` made the planner hash
    -- the whole table once batches grew past ~100.
    WHERE j.id = ANY(ARRAY(SELECT id FROM ready))
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.run_at, j.attempts,
              j.max_attempts, j.attempt_token
)
-- The payload comes back as text: the job's own worker thread parses it, off the one thread
-- that talks to the database.
SELECT true AS completed, id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, NULL::uuid AS attempt_token
FROM completed
UNION ALL
(SELECT false, id, queue, kind, payload::text, attempts, max_attempts, attempt_token
 FROM claimed
 ORDER BY priority, run_at, id);

-- name: job_complete_many :many
-- Mark finished jobs done without claiming (the run's last flush). The same update as the
-- `completed` part of job_complete_and_claim; a unit test keeps the two in step.
UPDATE pgdrain.jobs AS j
SET status = 'done',
    completed_token = held.token,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    last_error = NULL,
    finished_at = now(),
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS held(id, token)
WHERE j.id = held.id
  AND j.status = 'running'
  AND j.attempt_token = held.token
RETURNING j.id;

-- name: job_fail :one
-- A failed attempt: retry at now() + delay, or `failed` once attempts reach max_attempts
-- (or at once when %(final)s: discarded, cancelled). A snooze (%(spend_attempt)s false) gives
-- the attempt back and is queued whatever attempts are left. %(error_record)s (a JSON object,
-- or NULL for a snooze) is appended to the job's error history with the attempt number and
-- the database's time, in this same fenced statement; the history keeps the latest 50.
UPDATE pgdrain.jobs AS j
SET status = CASE WHEN %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts)
                  THEN 'failed' ELSE 'queued' END,
    run_at = CASE WHEN %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts)
                  THEN j.run_at
                  ELSE now() + make_interval(secs => %(delay_seconds)s) END,
    finished_at = CASE WHEN %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts)
                       THEN now() END,
    attempts = CASE WHEN %(spend_attempt)s THEN j.attempts ELSE j.attempts - 1 END,
    last_error = %(error)s,
    errors = CASE WHEN %(error_record)s::jsonb IS NULL THEN j.errors
                  ELSE (CASE WHEN jsonb_array_length(j.errors) >= 50 THEN j.errors - 0
                             ELSE j.errors END)
                       || jsonb_build_array(%(error_record)s::jsonb
                                            || jsonb_build_object('attempt', j.attempts,
                                                                  'at', now()))
             END,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    updated_at = now()
WHERE j.id = %(id)s
  AND j.status = 'running'
  AND j.attempt_token = %(token)s
RETURNING j.id, j.status, j.attempts, j.run_at;

-- name: job_release_many :many
-- Give back claimed jobs that never started: queued again, the attempt not spent.
UPDATE pgdrain.jobs AS j
SET status = 'queued',
    attempts = j.attempts - 1,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS held(id, token)
WHERE j.id = held.id
  AND j.status = 'running'
  AND j.attempt_token = held.token
RETURNING j.id;

-- name: job_reclaim_expired :many
-- Take back running jobs whose lease expired: queued again when the policy is auto and
-- attempts remain, failed when they are spent (a job that kills its worker every time must
-- end), parked when the policy is manual (a person decides: `pgdrain retry ID`).
WITH expired AS (
    SELECT id, attempt_token
    FROM pgdrain.jobs
    WHERE status = 'running'
      AND lease_expires_at < now()
    ORDER BY lease_expires_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE pgdrain.jobs AS j
SET status = CASE WHEN j.recovery_policy = 'manual' THEN 'parked'
                  WHEN j.attempts < j.max_attempts THEN 'queued' ELSE 'failed' END,
    run_at = CASE WHEN j.recovery_policy = 'auto' AND j.attempts < j.max_attempts
                  THEN now() ELSE j.run_at END,
    -- A parked job is not finished: retention never deletes it.
    finished_at = CASE WHEN j.recovery_policy = 'auto' AND j.attempts >= j.max_attempts
                       THEN now() END,
    reclaim_count = j.reclaim_count + 1,
    last_error = 'lease expired before completion (attempt ' || j.attempts || ' of '
                 || j.max_attempts || ', held by ' || j.leased_by || ')',
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    updated_at = now()
FROM expired
WHERE j.id = expired.id
  AND j.status = 'running'
  AND j.attempt_token = expired.attempt_token
RETURNING j.id, j.status, j.reclaim_count;

-- name: job_retry :many
-- Operator action: put failed, parked or cancelled jobs back in the queue with a fresh set
-- of attempts. Safe to run twice: a job already queued again no longer matches. A finished
-- job freed its idempotency key; if a newer unfinished job of its queue holds that key now,
-- it is not retried (that job already does the work), and is not returned.
UPDATE pgdrain.jobs AS j
SET status = 'queued', attempts = 0, run_at = now(), finished_at = NULL, updated_at = now()
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.status IN ('failed', 'parked', 'cancelled')
  AND (j.idempotency_key IS NULL OR NOT EXISTS (
      SELECT FROM pgdrain.jobs AS o
      WHERE o.queue = j.queue
        AND o.idempotency_key = j.idempotency_key
        AND o.status IN ('queued', 'running')))
RETURNING j.id;

-- name: job_purge_finished :rowcount
-- Delete one batch of finished jobs (%(statuses)s: done, failed, cancelled) that finished
-- more than %(days)s days ago, in one queue or all (%(queue)s NULL). Purge and retention
-- both run it batch by batch; safe to run twice: a deleted row matches nothing.
DELETE FROM pgdrain.jobs
WHERE id IN (
    SELECT id FROM pgdrain.jobs
    WHERE status IN ('done', 'failed', 'cancelled')
      AND status = ANY(%(statuses)s::text[])
      AND finished_at < now() - %(days)s * interval '1 day'
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    LIMIT %(limit)s
);

-- name: job_list :many
-- The newest jobs matching the filters; a NULL filter matches every job. --since compares
-- updated_at: the job's last change of state (enqueued, claimed, failed, finished...).
SELECT id, queue, kind, status, priority, attempts, max_attempts, reclaim_count,
       run_at, lease_expires_at, created_at, updated_at, finished_at, last_error
FROM pgdrain.jobs
WHERE status = ANY(%(statuses)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_stats :many
-- Counts per queue and status, the age of the oldest ready job, and running jobs whose
-- lease has expired (non-zero for long means reclaim is not running). queued, ready, delayed,
-- running and expired_leases are exact, read from the partial indexes of queued and running
-- rows (their cost grows with the backlog, not the history). done, failed, parked and
-- cancelled are exact up to 10,000 per queue and read as 10000 above that: counting a history
-- of millions of rows each time is what made stats slow, so each count stops at the bound (an
-- index-only scan of jobs_finished_queue_idx). The queues that only have history are found by
-- skipping through the same index, one probe per queue.
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
)
SELECT coalesce(queued.queue, running.queue, finished.queue) AS queue,
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
       coalesce(running.expired_leases, 0)                    AS expired_leases
FROM queued
FULL JOIN running ON running.queue = queued.queue
FULL JOIN finished ON finished.queue = coalesce(queued.queue, running.queue)
ORDER BY 1;

-- name: queue_has_ready :one
-- Is anything ready in these queues? Decides whether a run out of budget continues itself.
-- One probe per queue of the range run_at <= now() in jobs_queued_run_at_idx. As
-- `queue = ANY(...)` over the table, the planner expected a ready row early in a sequential
-- scan and read every finished row first (180 ms at 2 million).
SELECT EXISTS (
    SELECT 1
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT 1 FROM pgdrain.jobs
        WHERE status = 'queued'
          AND queue = q.name
          AND run_at <= now()
        ORDER BY run_at
        LIMIT 1
    ) AS one
) AS ready;

-- name: kick_debounce :many
-- Record a kick for each queue whose last kick is older than the window; the queues returned
-- are the ones to invoke for. Concurrent callers serialise on the row, so one wins per window.
INSERT INTO pgdrain.kicks AS k (queue, kicked_at)
SELECT q, now() FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO UPDATE
SET kicked_at = excluded.kicked_at
WHERE k.kicked_at < now() - make_interval(secs => %(window_seconds)s)
RETURNING k.queue;

-- name: queue_depth :one
-- Ready jobs in these queues and the age of the oldest: the backlog a run leaves behind
-- (the QueueDepth and OldestReadyAgeSeconds metrics). Exact, so its cost grows with the
-- ready rows (never the finished ones): an index-only scan of the range run_at <= now() in
-- jobs_queued_run_at_idx, delayed rows not visited.
SELECT count(*) AS ready,
       coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8 AS oldest_ready_age_s
FROM pgdrain.jobs
WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now();

-- name: job_show :one
-- Every column of one job, as JSON (so a column added by a later migration, such as the
-- error history, shows without changing this statement).
SELECT to_jsonb(j) AS job FROM pgdrain.jobs AS j WHERE j.id = %(id)s;

-- name: job_retry_matching :many
-- Operator action by filter: queue again the jobs in %(statuses)s (failed, parked) matching
-- the filters (a NULL filter matches every job), with a fresh set of attempts. `--dry-run`
-- runs it in a transaction that is rolled back. Safe to run twice: a job queued again no
-- longer matches.
UPDATE pgdrain.jobs
SET status = 'queued', attempts = 0, run_at = now(), finished_at = NULL, updated_at = now()
WHERE status IN ('failed', 'parked')
  AND status = ANY(%(statuses)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
RETURNING id, queue, kind;

-- name: job_cancel :many
-- Operator action: a queued or parked job never runs; a running one loses its lease (status
-- and token change), so its run's heartbeat reports it lost, job.lease_lost() turns true and
-- the fenced completion or failure of that attempt is refused. Returns each cancelled job with
-- the status it had. Safe to run twice: a cancelled job no longer matches.
WITH target AS (
    SELECT id, status
    FROM pgdrain.jobs
    WHERE id = ANY(%(ids)s::bigint[])
      AND status IN ('queued', 'running', 'parked')
    FOR UPDATE
)
UPDATE pgdrain.jobs AS j
SET status = 'cancelled',
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    finished_at = now(),
    updated_at = now()
FROM target
WHERE j.id = target.id
RETURNING j.id, target.status AS was;

-- name: job_count_finished :one
-- What job_purge_finished would delete, counted (purge --dry-run): the same conditions.
SELECT count(*) AS jobs
FROM pgdrain.jobs
WHERE status IN ('done', 'failed', 'cancelled')
  AND status = ANY(%(statuses)s::text[])
  AND finished_at < now() - %(days)s * interval '1 day'
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text);
