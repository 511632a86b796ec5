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

-- name: transaction_begin :exec
-- A drain transaction sent in one round trip with its statement (session.py): READ COMMITTED
-- whatever the server's default (the claim and the fenced updates rely on it).
BEGIN ISOLATION LEVEL READ COMMITTED;

-- name: transaction_commit :exec
COMMIT;

-- name: transaction_limits :exec
-- The first statement of each of the drain's transactions: no statement, and no wait for a
-- lock, may last longer than what is left of the run's budget. `true` makes the settings local
-- to this transaction, so nothing outlives it on a pooled server connection.
-- Every statement runs on its generic plan (plan_cache_mode): planned once per connection, not
-- at every batch. Left to choose (auto), the server planned the claim anew at every batch (its
-- generic plan is costed for 10 queues, the custom ones for the run's few), and the planning
-- cost a third of a claim of 10 (one process drained 7,190 no-op jobs/s at batch 10 on its
-- custom plans, 8,674 on the generic one; 952 against 1,384 at batch 1). A generic plan cannot
-- look at the parameters, so each statement is written for a plan that holds whatever the
-- statistics say: the fenced writes find their rows by primary key (`id = ANY(ids)`, the fence
-- in a CASE so that no partial index of running rows, costed from statistics that may have
-- seen none running, looks cheaper), and tests/integration/test_query_plans.py checks each
-- generic plan on a long history.
-- No statement is compiled by JIT: on a long history (2 M finished and 200 k queued rows) the
-- claim's generic plan, which the server keeps once it costs no more than the custom ones,
-- passed jit_above_cost, and JIT compiled it at every execution (32 ms of a 34 ms claim whose
-- plan runs in 0.6 ms, EXPLAIN ANALYZE). A claim, a heartbeat or a fenced update is never
-- long enough for JIT to pay.
-- And the planner may not choose an explicit sort where an index gives the order
-- (enable_sort off: a sort the statement cannot do without, as the claim's round-robin order,
-- still runs). With statistics that do not know a backlog (a table not analysed since a burst
-- of jobs came in: autovacuum analyses it a minute later at best, on a long history not before
-- a tenth of it changed) the planner believes few jobs are ready and claims through
-- jobs_queued_run_at_idx, reading and sorting every ready job of the queue at every claim: 18
-- to 40 ms a claim with 50,000 ready, against 0.5 ms along jobs_ready_idx, which gives the
-- claim's order (tests/integration/test_claim_plan.py).
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true),
       set_config('lock_timeout', %(timeout_ms)s::text, true),
       set_config('jit', 'off', true),
       set_config('enable_sort', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: session_limits :exec
-- The same limits and planner settings, and READ COMMITTED, kept by the connection (`false`:
-- past this transaction) until the run sends them again. Only on a connection of its own (not
-- behind a transaction pooler): its one-statement operations then go without BEGIN and COMMIT,
-- each its own implicit transaction (session.py says when they are sent again).
SELECT set_config('statement_timeout', %(timeout_ms)s::text, false),
       set_config('lock_timeout', %(timeout_ms)s::text, false),
       set_config('jit', 'off', false),
       set_config('enable_sort', 'off', false),
       set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('default_transaction_isolation', 'read committed', false);

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
-- Binary arrays: in text format psycopg quotes and escapes every element (a regular
-- expression each), which took most of enqueue_many's client time. Payloads come as JSON
-- text, encoded once by the caller (it sizes its chunks by them).
INSERT INTO pgdrain.jobs
    (queue, kind, payload, priority, run_at, max_attempts, recovery_policy, idempotency_key)
SELECT t.queue, t.kind, t.payload::jsonb, t.priority,
       coalesce(t.run_at, now() + make_interval(secs => t.delay_seconds)),
       t.max_attempts, t.recovery_policy, t.idempotency_key
FROM unnest(
    %(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
    %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[],
    %(recovery_policies)b::text[], %(idempotency_keys)b::text[]
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
-- Fenced as job_complete_and_claim's completions are, and found by primary key as they are.
WHERE j.id = ANY(%(ids)b::bigint[])
  AND CASE WHEN j.status = 'running' THEN CASE
      WHEN cardinality(%(tokens)b::uuid[]) < 100 THEN j.attempt_token = ANY(%(tokens)b::uuid[])
      ELSE (j.id, j.attempt_token) IN (SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]))
  END END
RETURNING j.id, j.attempt_token;

-- name: job_complete_and_claim :many
-- The drain's one round trip: mark the jobs this run finished done, then claim up to
-- %(limit)s ready jobs, the queues taking turns (round-robin, priority order within a turn)
-- and each limited queue (pgdrain.queue_limits) kept within its running limit across all
-- runs. SKIP LOCKED lets concurrent drains pass each other.
-- A finished job returned as lost had lost its lease: its result is not recorded, and
-- completed_token keeps the token of the attempt whose result was. A claimed lease never
-- reaches past the run's deadline (cap_seconds; NULL = no cap), measured on the database's
-- clock. One statement, so one commit, for both.
WITH completed AS (
    UPDATE pgdrain.jobs AS j
    SET status = 'done',
        completed_token = j.attempt_token,
        lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
        last_error = NULL,
        finished_at = now(),
        updated_at = now()
    -- The fence: only the attempt whose token this run holds (each attempt's token is a
    -- random UUID of its own, so matching the id and the token each against the lists is
    -- matching the pair). A short list is compared in turn; from 100 pairs on they are hashed,
    -- once, when a row first asks: at a batch of 1,000, comparing each row with every token
    -- took 1.5 ms of a 7.5 ms completion, and a hash of a few pairs costs more than it saves.
    -- Written so that the plan, generic, reads these rows by primary key.
    WHERE j.id = ANY(%(done_ids)b::bigint[])
      AND CASE WHEN j.status = 'running' THEN CASE
          WHEN cardinality(%(done_tokens)b::uuid[]) < 100 THEN j.attempt_token = ANY(%(done_tokens)b::uuid[])
          ELSE (j.id, j.attempt_token) IN (SELECT * FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]))
      END END
    RETURNING j.id, j.queue, j.completed_token AS token
), limits AS MATERIALIZED (
    -- Per-queue concurrency limits across all runs (pgdrain.queue_limits; most queues have
    -- none, and then nothing is locked). The row lock serialises the claims of a limited
    -- queue, and reads the running count as the last claim committed it.
    SELECT l.queue, l.max_running - l.running AS free
    FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(%(queues)s::text[])
    ORDER BY l.queue
    FOR UPDATE OF l
), slots AS (
    -- How many each queue may claim now: the batch, or its free slots (with the jobs this
    -- statement completes, whose counts the trigger moves only at its end).
    SELECT q.name,
           least(%(limit)s, greatest(0, coalesce(
               lim.free + (SELECT count(*) FROM completed AS c WHERE c.queue = q.name)::int,
               %(limit)s))) AS n
    FROM unnest(%(queues)s::text[]) AS q(name)
    LEFT JOIN limits AS lim ON lim.queue = q.name
), ready AS (
    -- Per queue, so that each scan walks jobs_ready_idx in order and stops at the limit
    -- (`queue = ANY(...)` would sort every ready row first).
    SELECT candidate.id
    FROM slots AS q
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
        LIMIT q.n
        FOR UPDATE SKIP LOCKED
    ) AS candidate
    -- Fair across queues (round-robin): every queue's first candidate comes before any queue's
    -- second, so a backlog in one queue cannot make a new job in another wait behind all of it;
    -- priority orders the jobs within a turn.
    ORDER BY
        row_number() OVER (PARTITION BY q.name ORDER BY candidate.priority, candidate.run_at, candidate.id),
        candidate.priority, candidate.run_at, candidate.id
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
-- Of the finished attempts only those the fence refused come back (rarely any): a row per
-- completed job was as many rows again as the claim's, each decoded by the one thread that
-- talks to the database. The payload comes back as text: the job's own worker thread parses
-- it, off that thread.
SELECT true AS lost, held.id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, held.token AS attempt_token
FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]) AS held(id, token)
WHERE NOT EXISTS (SELECT 1 FROM completed AS c WHERE c.id = held.id AND c.token = held.token)
UNION ALL
(SELECT false, id, queue, kind, payload::text, attempts, max_attempts, attempt_token
 FROM claimed
 ORDER BY priority, run_at, id);

-- name: job_claim_recover :many
-- After a lost reply (the connection broke once a statement was sent): what the claim
-- %(claim_id)s already did, if it committed. First the attempts it was to complete that are
-- recorded done (completed_token holds the accepted attempt's token), then the jobs it claimed
-- that still run under it (a later claim by anyone overwrites claim_id), found among the running
-- rows (jobs_lease_idx): claim_id has no index, which every claim would pay for (migration
-- 0011). Only reads: safe to repeat. A NULL claim id asks about completions alone.
SELECT true AS completed, j.id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, held.token AS attempt_token
FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]) AS held(id, token)
JOIN pgdrain.jobs AS j ON j.id = held.id
-- By primary key, as the completions are: no partial index of finished rows.
WHERE j.id = ANY(%(done_ids)b::bigint[])
  AND CASE WHEN j.status = 'done' THEN j.completed_token END = held.token
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
    completed_token = j.attempt_token,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    last_error = NULL,
    finished_at = now(),
    updated_at = now()
WHERE j.id = ANY(%(ids)b::bigint[])
  AND CASE WHEN j.status = 'running' THEN CASE
      WHEN cardinality(%(tokens)b::uuid[]) < 100 THEN j.attempt_token = ANY(%(tokens)b::uuid[])
      ELSE (j.id, j.attempt_token) IN (SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]))
  END END
RETURNING j.id, j.completed_token AS token;

-- name: job_fail :one
-- A failed attempt: retry at now() + delay, or `failed` once attempts reach max_attempts
-- (or at once when %(final)s: discarded; `cancelled` instead when %(cancelled)s, the job's
-- own Cancel, the state an operator's `pgdrain cancel` leaves too). A snooze
-- (%(spend_attempt)s false) gives the attempt back, keeps last_error (the latest real error:
-- a snooze is none) and is queued whatever attempts are left. %(error_record)s (a JSON
-- object, or NULL for a snooze) is appended to the job's error history with the attempt
-- number and the database's time, in this same fenced statement; the history keeps the
-- latest 50.
UPDATE pgdrain.jobs AS j
SET status = CASE WHEN %(cancelled)s THEN 'cancelled'
                  WHEN %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts)
                  THEN 'failed' ELSE 'queued' END,
    run_at = CASE WHEN %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts)
                  THEN j.run_at
                  ELSE now() + make_interval(secs => %(delay_seconds)s) END,
    finished_at = CASE WHEN %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts)
                       THEN now() END,
    attempts = CASE WHEN %(spend_attempt)s THEN j.attempts ELSE j.attempts - 1 END,
    last_error = CASE WHEN %(spend_attempt)s THEN %(error)s ELSE j.last_error END,
    errors = CASE WHEN %(error_record)s::jsonb IS NULL THEN j.errors
                  ELSE (CASE WHEN jsonb_array_length(j.errors) >= 50 THEN j.errors - 0
                             ELSE j.errors END)
                       || jsonb_build_array(%(error_record)s::jsonb
                                            || jsonb_build_object('attempt', j.attempts,
                                                                  'at', now()))
             END,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    updated_at = now()
-- Fenced, and found by primary key, as job_complete_and_claim's completions are.
WHERE j.id = %(id)s
  AND CASE WHEN j.status = 'running' THEN j.attempt_token END = %(token)s
RETURNING j.id, j.status, j.attempts, j.run_at;

-- name: job_release_many :many
-- Give back claimed jobs that never started: queued again, the attempt not spent.
UPDATE pgdrain.jobs AS j
SET status = 'queued',
    attempts = j.attempts - 1,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    updated_at = now()
-- held gives back the token the update clears; the rows are found by primary key all the same.
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]) AS held(id, token)
WHERE j.id = ANY(%(ids)b::bigint[])
  AND j.id = held.id
  AND CASE WHEN j.status = 'running' THEN j.attempt_token END = held.token
RETURNING j.id, held.token;

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

-- name: job_retention_batch :one
-- One retention batch, in one statement: at most %(done_limit)s done jobs finished more than
-- %(done_days)s days ago, and at most %(failed_limit)s failed or cancelled ones finished more
-- than %(failed_days)s days ago (parked jobs wait for a person: never). Returns how many of
-- each went; a count short of its limit means that kind is done. Safe to run twice: a deleted
-- row matches nothing. The rows go by primary key (an array of ids, as the claim's), whatever
-- the generic plan guesses of the cutoff: `id IN (...)` was planned as a sequential scan.
WITH done AS (
    DELETE FROM pgdrain.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.jobs
        WHERE status IN ('done', 'failed', 'cancelled')  -- finished rows only, whatever follows
          AND status = 'done' AND finished_at < now() - %(done_days)s * interval '1 day'
        LIMIT %(done_limit)s
    ))
    RETURNING 1
), failed AS (
    DELETE FROM pgdrain.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.jobs
        WHERE status IN ('done', 'failed', 'cancelled')
          AND status IN ('failed', 'cancelled')
          AND finished_at < now() - %(failed_days)s * interval '1 day'
        LIMIT %(failed_limit)s
    ))
    RETURNING 1
)
SELECT (SELECT count(*) FROM done) AS done, (SELECT count(*) FROM failed) AS failed;

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
-- Record a kick for each queue (requested_at, always) and invoke for each queue that needs a
-- run now, whose last invoke is older than the window (kicked_at) and that no live run drains
-- (run_until); `invoke` says which.
-- Concurrent callers serialise on the row, so one wins per window. A suppressed kick is not
-- lost: a run about to exit sees its requested_at (run_exit) and drains again, and a run
-- that exits clears kicked_at (run_exit too), so the next kick invokes.
-- A queue with nothing ready needs no run now. When its next job is due before any wake-up
-- pending for it (wake-ups are rounded up to %(precision_seconds)s) and no live run drains it,
-- `later_at` says when that job is due: the kick asks for a wake-up then, without a run now
-- that would only find nothing (and keep a sleeping database awake).
WITH pending AS (
    SELECT q.name,
           -- A wake-up of any set of queues that holds this one starts a run that drains it.
           (SELECT min(w.wake_at) FROM pgdrain.wakes AS w
            WHERE q.name = ANY(string_to_array(w.queue_set, ','))
              AND w.state = 'created' AND w.wake_at > now()) AS wake_at,
           (SELECT min(j.run_at) FROM pgdrain.jobs AS j
            WHERE j.status = 'queued' AND j.queue = q.name) AS next_at
    FROM unnest(%(queues)s::text[]) AS q(name)
), wanted AS (
    SELECT p.name,
           -- Ready now, or nothing queued and no wake-up pending (a run now finds what there is).
           p.next_at <= now() OR (p.next_at IS NULL AND p.wake_at IS NULL) AS needed,
           CASE WHEN p.next_at > now()
                 AND (p.wake_at IS NULL
                      OR p.next_at <= p.wake_at - make_interval(secs => %(precision_seconds)s::float8))
                THEN p.next_at END AS later_at
    FROM pending AS p
)
-- The kick that invokes holds the queue's kicks for %(hold_seconds)s (run_until), until the run
-- it starts has registered and holds them itself (run_register, kick_hold): the kicks in
-- between are that run's, not new invocations.
INSERT INTO pgdrain.kicks AS k (queue, kicked_at, requested_at, run_until)
SELECT w.name, CASE WHEN w.needed THEN now() ELSE '-infinity'::timestamptz END, now(),
       CASE WHEN w.needed THEN now() + make_interval(secs => %(hold_seconds)s::float8) END
FROM wanted AS w
ORDER BY w.name  -- every statement locks kick rows in queue order: no deadlock between them
ON CONFLICT (queue) DO UPDATE
SET requested_at = excluded.requested_at,
    kicked_at = CASE WHEN excluded.kicked_at = now()
                      AND k.kicked_at < now() - make_interval(secs => %(window_seconds)s)
                      AND (k.run_until IS NULL OR k.run_until <= now())
                     THEN excluded.kicked_at ELSE k.kicked_at END,
    run_until = CASE WHEN excluded.kicked_at = now()
                      AND k.kicked_at < now() - make_interval(secs => %(window_seconds)s)
                      AND (k.run_until IS NULL OR k.run_until <= now())
                     THEN excluded.run_until ELSE k.run_until END
-- (A queue that needs no run keeps its run_until: a live run that holds it makes the wake-up
-- for its delayed jobs when it exits.)
RETURNING k.queue, k.kicked_at = now() AS invoke,
          CASE WHEN k.run_until IS NULL OR k.run_until <= now()
               THEN (SELECT w.later_at FROM wanted AS w WHERE w.name = k.queue) END AS later_at;

-- name: kick_clear :exec
-- A kick whose invoke failed suppresses nothing: the next kick for these queues invokes (it
-- invoked because no run held them, so the hold it set is its own).
-- (The rows are locked in queue order, as every statement on them does.)
UPDATE pgdrain.kicks SET kicked_at = '-infinity', run_until = NULL
WHERE queue IN (
    SELECT queue FROM pgdrain.kicks
    WHERE queue = ANY(%(queues)s::text[])
    ORDER BY queue
    FOR UPDATE
);

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

-- name: queue_ready_count :one
-- Ready jobs in these queues, counted up to %(limit)s (the fan-out decision only needs to
-- know whether the backlog exceeds what the runs can finish).
SELECT count(*) AS ready FROM (
    SELECT 1 FROM pgdrain.jobs
    WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now()
    LIMIT %(limit)s::int
) AS ready;

-- name: run_register :exec
-- A run announces itself once connected (a spawned run replaces the reservation its spawner
-- made under the same id), and holds its queues' kicks for %(hold_seconds)s (run_until; never
-- past its deadline): kicks do not invoke more runs while it drains. Repeating it changes
-- nothing but the deadline and the hold: safe to retry.
WITH registered AS (
    INSERT INTO pgdrain.runs (run_id, queues, chain, deadline)
    VALUES (%(run_id)s::text, %(queues)s::text[], %(chain)s::int,
            now() + make_interval(secs => %(remaining_seconds)s::float8))
    ON CONFLICT (run_id) DO UPDATE
    SET queues = excluded.queues, chain = excluded.chain, deadline = excluded.deadline
    RETURNING deadline
)
INSERT INTO pgdrain.kicks AS k (queue, kicked_at, run_until)
SELECT q.name, '-infinity',
       least((SELECT deadline FROM registered),
             now() + make_interval(secs => %(hold_seconds)s::float8))
FROM unnest(%(queues)s::text[]) AS q(name)
ORDER BY q.name  -- every statement locks kick rows in queue order: no deadlock between them
ON CONFLICT (queue) DO UPDATE
SET run_until = greatest(k.run_until, excluded.run_until);

-- name: kick_hold :exec
-- A live run renews its hold on its queues' kicks (run_register): until now + %(hold_seconds)s,
-- which the caller keeps within its deadline. Safe to repeat: it only moves run_until later.
UPDATE pgdrain.kicks AS k
SET run_until = greatest(k.run_until, now() + make_interval(secs => %(hold_seconds)s::float8))
WHERE k.queue IN (
    SELECT queue FROM pgdrain.kicks
    WHERE queue = ANY(%(queues)s::text[])
    ORDER BY queue
    FOR UPDATE  -- in queue order, as every statement that locks kick rows
);

-- name: run_gate_lock :exec
-- Serialise fan-out decisions until the transaction ends. Taken in a statement of its own, so
-- that the count that follows reads a snapshot taken after the lock was granted.
SELECT id FROM pgdrain.run_gate FOR UPDATE;

-- name: run_spawn :many
-- Reserve new runs until the live runs (deadline not passed) number %(runs_needed)s, and never
-- more than %(max_runs)s; returns the ids reserved. Each reservation lasts %(reserve_seconds)s, until the
-- spawned run registers with its own deadline; a spawn that never starts stops counting then.
-- Run after run_gate_lock in the same transaction.
INSERT INTO pgdrain.runs (run_id, queues, chain, deadline)
SELECT gen_random_uuid()::text, %(queues)s::text[], %(chain)s::int,
       now() + make_interval(secs => %(reserve_seconds)s::float8)
FROM generate_series(
    1,
    least(%(runs_needed)s::int, %(max_runs)s::int)
        - (SELECT count(*) FROM pgdrain.runs WHERE deadline > now())::int
)
RETURNING run_id;

-- name: run_unregister :exec
-- Forget a run: one that exits, or a reservation whose invoke failed.
DELETE FROM pgdrain.runs WHERE run_id = %(run_id)s;

-- name: run_exit :one
-- A run that found nothing to claim exits, unless it must stay, in one statement: it drains
-- again for a kick or a ready job its last claim may have missed (when %(may_stay)s), and it
-- lingers while its queues' latest kick is younger than %(linger_window_s)s (a burst becomes one
-- invocation). Deciding here, not in the caller, makes the exit one round trip.
-- It locks the queues' kick rows (FOR UPDATE re-reads a row a concurrent kick committed while
-- this statement waited), so a kick either lands before this check, where it is seen, or after
-- the exit, where it invokes. `kicked` is true for a kick whose transaction started after this
-- one: its enqueue may have committed after this statement's snapshot. An older kick's enqueue
-- committed before this snapshot, and `ready` sees its job. `due_at` is the earliest run_at of
-- a queued job still in the future, or lease expiry of a running job (a dead run's jobs
-- become claimable then): the wake-up this run must make sure of.
-- Exiting, the kicks of its queues no longer wait on it (with %(clear_kicks)s: the next kick
-- invokes, even while another run still drains the queue: at worst one invocation that finds
-- nothing), and it no longer counts as a live run. The rows of runs that died (past their
-- deadline for an hour) go too, so the table stays as small as the number of live runs.
-- Safe to repeat: the check only reads, and the exit clears and deletes what is already
-- cleared or gone.
WITH kick AS MATERIALIZED (
    SELECT requested_at FROM pgdrain.kicks
    WHERE queue = ANY(%(queues)s::text[])
    ORDER BY queue
    FOR UPDATE
), seen AS MATERIALIZED (
    SELECT
        coalesce((SELECT bool_or(requested_at >= now()) FROM kick), false) AS kicked,
        -- How long ago the latest kick of these queues was. NULL when none was ever recorded
        -- ('-infinity').
        (SELECT extract(epoch FROM now() - max(requested_at))::float8 FROM kick
         WHERE requested_at > '-infinity') AS kick_age_s,
        -- SKIP LOCKED: a job another run is claiming right now is that run's, not a reason to
        -- drain again (the lock lasts until this short transaction ends).
        -- A queue at its concurrency limit has nothing claimable either: the runs holding its
        -- slots claim its next jobs as they finish.
        -- One probe per queue along jobs_queued_run_at_idx, as queue_has_ready: as
        -- `queue = ANY(...)` over the table, the planner expected a ready row early in a
        -- sequential scan, which reads the whole history first.
        EXISTS (
            SELECT 1
            FROM unnest(%(queues)s::text[]) AS q(name)
            CROSS JOIN LATERAL (
                SELECT 1 FROM pgdrain.jobs AS j
                WHERE j.status = 'queued' AND j.queue = q.name AND j.run_at <= now()
                ORDER BY j.run_at
                LIMIT 1
                FOR UPDATE OF j SKIP LOCKED
            ) AS one
            WHERE NOT EXISTS (
                SELECT 1 FROM pgdrain.queue_limits AS l
                WHERE l.queue = q.name AND l.running >= l.max_running
            )
        ) AS ready,
        least(
            -- The earliest delayed job, one probe per queue (over all queues at once, the
            -- minimum read every delayed row: 5.9 ms with 100,000 delayed).
            (SELECT min(next.run_at)
             FROM unnest(%(queues)s::text[]) AS q(name)
             CROSS JOIN LATERAL (
                 SELECT j.run_at FROM pgdrain.jobs AS j
                 WHERE j.status = 'queued' AND j.queue = q.name AND j.run_at > now()
                 ORDER BY j.run_at
                 LIMIT 1
             ) AS next),
            (SELECT min(lease_expires_at) FROM pgdrain.jobs
             WHERE status = 'running' AND queue = ANY(%(queues)s::text[]))
        ) AS due_at
), decided AS MATERIALIZED (
    SELECT NOT %(may_stay)s::boolean
           OR (NOT (s.kicked OR s.ready)
               AND (s.kick_age_s IS NULL OR s.kick_age_s >= %(linger_window_s)s::float8)) AS exits
    FROM seen AS s
), cleared AS (
    UPDATE pgdrain.kicks SET kicked_at = '-infinity', run_until = NULL
    WHERE queue = ANY(%(queues)s::text[])
      AND %(clear_kicks)s::boolean AND (SELECT exits FROM decided)
), unregistered AS (
    DELETE FROM pgdrain.runs
    WHERE (run_id = %(run_id)s OR deadline < now() - interval '1 hour')
      AND (SELECT exits FROM decided)
)
SELECT s.kicked, s.kick_age_s, s.ready, s.due_at, d.exits FROM seen AS s, decided AS d;

-- name: wake_reserve :one
-- Claim the right to create the one-shot schedule for %(wake_at)s, unless an earlier or equal
-- wake-up of the same queues is pending (created, or being created and reserved_until not
-- passed). The same run may reserve again (a retried statement). Returns a row when the
-- caller must create the schedule.
INSERT INTO pgdrain.wakes AS w (queue_set, wake_at, state, reserved_by, reserved_until)
VALUES (%(queue_set)s::text, %(wake_at)s::timestamptz, 'creating', %(run_id)s::text,
        now() + make_interval(secs => %(hold_seconds)s::float8))
ON CONFLICT (queue_set) DO UPDATE
SET wake_at = excluded.wake_at, state = 'creating', reserved_by = excluded.reserved_by,
    reserved_until = excluded.reserved_until
WHERE w.wake_at <= now()
   OR w.wake_at > excluded.wake_at
   OR (w.state = 'creating' AND w.reserved_until <= now())
   OR (w.state = 'creating' AND w.reserved_by = excluded.reserved_by
       AND w.wake_at = excluded.wake_at)
RETURNING w.wake_at;

-- name: wake_created :exec
-- The schedule exists: the reservation becomes a pending wake-up until its time.
UPDATE pgdrain.wakes SET state = 'created'
WHERE queue_set = %(queue_set)s AND wake_at = %(wake_at)s AND reserved_by = %(run_id)s;

-- name: wake_release :exec
-- Creating the schedule failed: drop the reservation, so the next run that ends tries again.
-- (Whatever its state: a kick marks its wake-up created before the function it invokes creates
-- the schedule, and that function drops it if it cannot.)
DELETE FROM pgdrain.wakes
WHERE queue_set = %(queue_set)s AND wake_at = %(wake_at)s AND reserved_by = %(run_id)s;

-- name: queue_limit_sync :exec
-- Make pgdrain.queue_limits say what PGDRAIN_QUEUE_LIMITS says for these queues: add or change
-- the limits given, drop the others. A new limit starts from the queue's running jobs. Safe to
-- repeat: it writes the same values again.
WITH wanted AS (
    SELECT w.queue, w.max_running
    FROM unnest(%(limited)s::text[], %(limits)s::int[]) AS w(queue, max_running)
), dropped AS (
    DELETE FROM pgdrain.queue_limits
    WHERE queue = ANY(%(queues)s::text[])
      AND queue NOT IN (SELECT queue FROM wanted)
)
INSERT INTO pgdrain.queue_limits AS l (queue, max_running, running)
SELECT w.queue, w.max_running,
       (SELECT count(*) FROM pgdrain.jobs AS j WHERE j.status = 'running' AND j.queue = w.queue)
FROM wanted AS w
ON CONFLICT (queue) DO UPDATE SET max_running = excluded.max_running
WHERE l.max_running <> excluded.max_running;
