-- Every statement pgdrain runs against the queue, each under a `-- name: NAME :SHAPE` line.
-- NAME is also the name of the pgdrain.store function that runs it (noun first, verb last, as
-- River names its queries). SHAPE is what the statement gives back: :one (at most one row),
-- :many (rows), :rowcount (only how many rows it changed), :exec (nothing).
-- Loaded once by pgdrain.sql; executed only by pgdrain.store.
-- Parameters are always bound (%(name)s); nothing here is ever formatted into a string.
-- Every statement after the claim is fenced by attempt_token: a fence condition stands on
-- a line of its own so that tests can derive the unfenced control from the real statement.

-- name: migration_lock :exec
-- Serialise concurrent `pgdrain migrate` runs; released when the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('pgdrain.migrate'));

-- name: migration_ledger_exists :one
SELECT to_regclass('pgdrain.migrations') IS NOT NULL AS present;

-- name: migration_applied :many
SELECT version FROM pgdrain.migrations ORDER BY version;

-- name: migration_record :exec
INSERT INTO pgdrain.migrations (version) VALUES (%(version)s);

-- name: transaction_limits :exec
-- The first statement of each of the drain's transactions: no statement, and no wait for a
-- lock, may last longer than what is left of the run's budget. `true` makes both settings
-- local to this transaction, so nothing outlives it on a pooled server connection.
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true),
       set_config('lock_timeout', %(timeout_ms)s::text, true);

-- name: job_insert :one
-- One job. A repeated idempotency key inserts nothing and returns no row.
INSERT INTO pgdrain.jobs
    (queue, kind, payload, priority, run_at, max_attempts, recovery_policy, idempotency_key)
VALUES
    (%(queue)s, %(kind)s, %(payload)s, %(priority)s,
     coalesce(%(run_at)s, now() + make_interval(secs => %(delay_seconds)s)),
     %(max_attempts)s, %(recovery_policy)s, %(idempotency_key)s)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: job_find_by_key :one
SELECT id FROM pgdrain.jobs WHERE idempotency_key = %(idempotency_key)s;

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
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
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
RETURNING j.id, held.token;

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
    RETURNING j.id, held.token
), ready AS (
    -- Per queue, so that each scan walks jobs_ready_idx in order and stops at the limit
    -- (`queue = ANY(...)` would sort every ready row first).
    SELECT candidate.id
    FROM unnest(%(queues)s::text[]) AS q(name)
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
        claim_id = %(claim_id)s,
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
       NULL::int AS attempts, NULL::int AS max_attempts, token AS attempt_token
FROM completed
UNION ALL
(SELECT false, id, queue, kind, payload::text, attempts, max_attempts, attempt_token
 FROM claimed
 ORDER BY priority, run_at, id);

-- name: job_claim_recover :many
-- After a lost reply (the connection broke once a statement was sent): what the claim
-- %(claim_id)s already did, if it committed. First the attempts it was to complete that are
-- recorded done (completed_token holds the accepted attempt's token), then the jobs it claimed
-- that still run under it (a later claim by anyone overwrites claim_id). Only reads: safe to
-- repeat. A NULL claim id asks about completions alone.
SELECT true AS completed, j.id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, held.token AS attempt_token
FROM unnest(%(done_ids)s::bigint[], %(done_tokens)s::uuid[]) AS held(id, token)
JOIN pgdrain.jobs AS j ON j.id = held.id
WHERE j.status = 'done'
  AND j.completed_token = held.token
UNION ALL
(SELECT false, id, queue, kind, payload::text, attempts, max_attempts, attempt_token
 FROM pgdrain.jobs
 WHERE claim_id = %(claim_id)s
   AND status = 'running'
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
RETURNING j.id, held.token;

-- name: job_fail :one
-- A failed attempt: retry at now() + delay, or `failed` once attempts reach max_attempts
-- (or at once when %(final)s: the job can never succeed as it is).
UPDATE pgdrain.jobs AS j
SET status = CASE WHEN %(final)s OR j.attempts >= j.max_attempts THEN 'failed'
                  ELSE 'queued' END,
    run_at = CASE WHEN %(final)s OR j.attempts >= j.max_attempts THEN j.run_at
                  ELSE now() + make_interval(secs => %(delay_seconds)s) END,
    finished_at = CASE WHEN %(final)s OR j.attempts >= j.max_attempts THEN now() END,
    last_error = %(error)s,
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
RETURNING j.id, held.token;

-- name: job_reclaim_expired :many
-- Take back running jobs whose lease expired: queued again when the policy is auto and
-- attempts remain, failed otherwise (a job that kills its worker every time must end).
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
SET status = CASE WHEN j.recovery_policy = 'auto' AND j.attempts < j.max_attempts
                  THEN 'queued' ELSE 'failed' END,
    run_at = CASE WHEN j.recovery_policy = 'auto' AND j.attempts < j.max_attempts
                  THEN now() ELSE j.run_at END,
    finished_at = CASE WHEN j.recovery_policy = 'auto' AND j.attempts < j.max_attempts
                       THEN NULL ELSE now() END,
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
-- Operator action: put failed jobs back in the queue with a fresh set of attempts.
UPDATE pgdrain.jobs
SET status = 'queued', attempts = 0, run_at = now(), finished_at = NULL, updated_at = now()
WHERE id = ANY(%(ids)s::bigint[])
  AND status = 'failed'
RETURNING id;

-- name: job_purge_finished :rowcount
-- Delete one batch of done/failed jobs finished more than %(days)s days ago.
DELETE FROM pgdrain.jobs
WHERE id IN (
    SELECT id FROM pgdrain.jobs
    WHERE status IN ('done', 'failed')
      AND finished_at < now() - %(days)s * interval '1 day'
    LIMIT %(limit)s
);

-- name: job_list :many
SELECT id, queue, kind, status, priority, attempts, max_attempts, reclaim_count,
       run_at, lease_expires_at, last_error
FROM pgdrain.jobs
WHERE status = ANY(%(statuses)s::text[])
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_stats :many
-- Counts per queue and status, the age of the oldest ready job, and running jobs whose
-- lease has expired (non-zero for long means reclaim is not running).
SELECT queue,
       count(*) FILTER (WHERE status = 'queued')                      AS queued,
       count(*) FILTER (WHERE status = 'queued' AND run_at <= now())  AS ready,
       count(*) FILTER (WHERE status = 'running')                     AS running,
       count(*) FILTER (WHERE status = 'done')                        AS done,
       count(*) FILTER (WHERE status = 'failed')                      AS failed,
       coalesce(extract(epoch FROM now() - min(run_at)
                FILTER (WHERE status = 'queued' AND run_at <= now())), 0)::float8
                                                                      AS oldest_ready_age_s,
       count(*) FILTER (WHERE status = 'running' AND lease_expires_at < now())
                                                                      AS expired_leases
FROM pgdrain.jobs
GROUP BY queue
ORDER BY queue;

-- name: queue_has_ready :one
-- Is anything ready in these queues? Decides whether a run out of budget continues itself.
SELECT EXISTS (
    SELECT 1 FROM pgdrain.jobs
    WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now()
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
-- (the QueueDepth and OldestReadyAgeSeconds metrics). Uses the ready-jobs index.
SELECT count(*) AS ready,
       coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8 AS oldest_ready_age_s
FROM pgdrain.jobs
WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now();
