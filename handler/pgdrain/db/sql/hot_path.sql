-- The statements of enqueue, and a run's claim, completions, failures, releases, heartbeat and
-- reclaim (db/store/hot_path.py).
-- Statements pgdrain runs against the queue, each under a `-- name: NAME :SHAPE` line.
-- NAME is also the name of the pgdrain.db.store function that runs it (noun first, verb last, as
-- River names its queries). SHAPE is what the statement gives back: :one (at most one row),
-- :many (rows), :rowcount (only how many rows it changed), :exec (nothing).
-- Loaded once by pgdrain.db.sql; executed only by pgdrain.db.store.
-- Parameters are always bound (%(name)s); nothing here is ever formatted into a string.
-- Every statement after the claim is fenced by attempt_token: a fence condition stands on
-- a line of its own so that tests can derive the unfenced control from the real statement.

-- name: transaction_begin :exec
-- A drain transaction sent in one round trip with its statement (session.py): READ COMMITTED
-- whatever the server's default (the claim and the fenced updates rely on it), and READ WRITE
-- whatever the role's (a role may set its own default_transaction_read_only).
BEGIN ISOLATION LEVEL READ COMMITTED
      READ WRITE  -- a role's own default

-- name: transaction_commit :exec
COMMIT;

-- name: transaction_rollback :exec
ROLLBACK;

-- name: transaction_open :exec
-- Nothing, run first on a connection that is not autocommit and has no transaction open:
-- psycopg begins the caller's transaction before it, so that a savepoint taken next lies
-- inside that transaction and pgdrain commits nothing (enqueue_many, workflow).
SELECT 1

-- name: transaction_limits :exec
-- The first statement of each of the drain's transactions: no statement, and no wait for a
-- lock, may last longer than what is left of the run's budget. `true` makes the settings local
-- to this transaction, so nothing outlives it on a pooled server connection.
-- Every statement runs on its generic plan (plan_cache_mode): planned once per connection, not
-- at every batch. Left to choose (auto), the server planned the claim anew at every batch (its
-- generic plan is costed for 10 queues, the custom ones for the run's few): a third of a
-- claim's cost (docs/decisions/0005). A generic plan cannot look at the parameters, so each statement is written for a plan that holds whatever the
-- statistics say: the fenced writes find their rows by primary key (`id = ANY(ids)`, the fence
-- in a CASE so that no partial index of running rows, costed from statistics that may have
-- seen none running, looks cheaper), and tests/integration/test_query_plans.py checks each
-- generic plan on a long history.
-- No statement is compiled by JIT: on a long history (2 M finished and 200 k queued rows) the
-- claim's generic plan passed jit_above_cost, and JIT compiled it at every execution, for
-- far longer than the plan runs. A claim, a heartbeat or a fenced update is never long
-- enough for JIT to pay.
-- And the planner may not choose an explicit sort where an index gives the order
-- (enable_sort off: a sort the statement cannot do without, as the claim's round-robin order,
-- still runs). With statistics that do not know a backlog (a table not analysed since a burst
-- of jobs came in: autovacuum analyses it a minute later at best, on a long history not before
-- a tenth of it changed) the planner believes few jobs are ready and claims through
-- jobs_queued_run_at_idx, reading and sorting every ready job of the queue at every claim,
-- instead of walking jobs_ready_idx, which gives the claim's order
-- (tests/integration/test_claim_plan.py).
-- The role's own defaults cannot change what the drain relies on either: a role may ALTER ROLE
-- itself (PostgreSQL cannot deny it), and its settings apply to every session it opens. So the
-- names here are schema-qualified (a search_path of the role's own could shadow them), and
-- each line marked `a role's own default` sets what the drain relies on: the statements resolve
-- in pg_catalog (every table is named with its schema), a transaction idle between its round
-- trips is not ended, psycopg reads timestamps in the ISO style, PostgreSQL 17's
-- transaction_timeout ends no transaction (where it exists).
SELECT pg_catalog.set_config('statement_timeout', CAST(%(timeout_ms)s AS pg_catalog.text), true),
       pg_catalog.set_config('lock_timeout', CAST(%(timeout_ms)s AS pg_catalog.text), true),
       pg_catalog.set_config('jit', 'off', true),
       pg_catalog.set_config('enable_sort', 'off', true),
       pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true)
       , pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)  -- a role's own default
       , pg_catalog.set_config('idle_in_transaction_session_timeout', '0', true)  -- a role's own default
       , pg_catalog.set_config('DateStyle', 'ISO', true)  -- a role's own default
       , CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NOT NULL THEN pg_catalog.set_config('transaction_timeout', '0', true) END  -- a role's own default
;

-- name: session_limits :exec
-- The same limits and planner settings, and READ COMMITTED, kept by the connection (`false`:
-- past this transaction) until the run sends them again. Only on a connection of its own (not
-- behind a transaction pooler): its one-statement operations then go without BEGIN and COMMIT,
-- each its own implicit transaction (session.py says when they are sent again).
-- The role's own defaults are overridden as in transaction_limits, for the session: also its
-- default_transaction_read_only (a statement alone is its own transaction) and
-- idle_session_timeout (the connection idles while jobs run).
SELECT pg_catalog.set_config('statement_timeout', CAST(%(timeout_ms)s AS pg_catalog.text), false),
       pg_catalog.set_config('lock_timeout', CAST(%(timeout_ms)s AS pg_catalog.text), false),
       pg_catalog.set_config('jit', 'off', false),
       pg_catalog.set_config('enable_sort', 'off', false),
       pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', false),
       pg_catalog.set_config('default_transaction_isolation', 'read committed', false)
       , pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)  -- a role's own default
       , pg_catalog.set_config('default_transaction_read_only', 'off', false)  -- a role's own default
       , pg_catalog.set_config('idle_in_transaction_session_timeout', '0', false)  -- a role's own default
       , pg_catalog.set_config('DateStyle', 'ISO', false)  -- a role's own default
       , CASE WHEN pg_catalog.current_setting('idle_session_timeout', true) IS NOT NULL THEN pg_catalog.set_config('idle_session_timeout', '0', false) END  -- a role's own default
       , CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NOT NULL THEN pg_catalog.set_config('transaction_timeout', '0', false) END  -- a role's own default
;

-- name: job_insert :one
-- One job. A key held by an unfinished job (queued, running, parked, waiting) of the same
-- queue inserts nothing, no row. The conflict target names the states of migration 0004's
-- index, which infers 0012's and 0021's (their predicates, parked and waiting added, are
-- implied): the same text works on each schema. Every
-- parameter carries its type (CAST, not `::`, which SQLAlchemy's `:name` binds would misread),
-- so any driver can run this statement with plain values, the payload as JSON text:
-- pgdrain.enqueue_statement hands it to applications on other drivers.
-- A sequence or dependencies make the row `waiting` when something holds it back (migration
-- 0021's trigger jobs_flow_enqueued). The application's session has its own search_path:
-- pg_catalog.now() is the server's clock the drain reads, not a function of that name in a
-- schema earlier on the path (a test's mock clock).
INSERT INTO pgdrain.active_jobs
    (queue, kind, payload, priority, run_at, max_attempts, recovery_policy, idempotency_key,
     sequence, depends_on)
VALUES
    (CAST(%(queue)s AS text), CAST(%(kind)s AS text), CAST(%(payload)s AS jsonb),
     CAST(%(priority)s AS int),
     coalesce(CAST(%(run_at)s AS timestamptz),
              pg_catalog.now()
              + pg_catalog.make_interval(secs => CAST(%(delay_seconds)s AS float8))),
     CAST(%(max_attempts)s AS int), CAST(%(recovery_policy)s AS text),
     CAST(%(idempotency_key)s AS text), CAST(%(sequence)s AS text),
     CAST(%(depends_on)s AS bigint[]))
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
RETURNING id;

-- name: periodic_enqueue :many
-- The due slot of each periodic kind, enqueued only if later than the slot last enqueued for
-- that kind in its queue (periodic_slots; concurrent runs serialise on its row, so one of them
-- wins): a slot is enqueued once, and a second run, or a repeat of this statement after a
-- reconnect, enqueues nothing. The same kind in another queue (another deployment's) has a
-- row of its own (migration 0037). Returns the ids of the jobs created.
WITH due AS (
    SELECT *
    FROM unnest(%(kinds)s::text[], %(slots)s::timestamptz[], %(queues)s::text[],
                %(payloads)s::jsonb[], %(priorities)s::int[], %(max_attempts)s::int[],
                %(recovery_policies)s::text[])
         AS d(kind, slot, queue, payload, priority, max_attempts, recovery_policy)
), taken AS (
    INSERT INTO pgdrain.periodic_slots AS p (kind, queue, slot)
    SELECT d.kind, d.queue, d.slot FROM due AS d
    -- A kind's row from before migration 0037 keeps no queue: its slot was enqueued already.
    WHERE NOT EXISTS (SELECT 1 FROM pgdrain.periodic_slots AS before
                      WHERE before.kind = d.kind AND before.queue = '' AND before.slot >= d.slot)
    ON CONFLICT (kind, queue) DO UPDATE SET slot = excluded.slot, enqueued_at = now()
    WHERE p.slot < excluded.slot
    RETURNING p.kind, p.queue
)
INSERT INTO pgdrain.active_jobs (queue, kind, payload, priority, max_attempts, recovery_policy)
SELECT due.queue, due.kind, due.payload, due.priority, due.max_attempts, due.recovery_policy
FROM due
JOIN taken ON taken.kind = due.kind AND taken.queue = due.queue
RETURNING id;

-- name: job_find_by_key :one
-- The job of this queue that holds the key: queued, running, parked or waiting (at most one:
-- jobs_active_key_idx).
SELECT id FROM pgdrain.active_jobs
WHERE queue = %(queue)s
  AND idempotency_key = %(idempotency_key)s
  AND status IN ('queued', 'running', 'parked', 'waiting');

-- name: job_insert_many :many
-- Many jobs in one statement; rows whose idempotency key is held already are skipped (the
-- conflict target as job_insert's).
-- Binary arrays: in text format psycopg quotes and escapes every element (a regular
-- expression each), which took most of enqueue_many's client time. Payloads come as JSON
-- text, encoded once by the caller (it sizes its chunks by them).
-- A row's dependencies come as the text of an array ('{1,2}'): arrays of arrays must be
-- rectangular. Rows are inserted in input order: a sequence runs in that order.
INSERT INTO pgdrain.active_jobs
    (queue, kind, payload, priority, run_at, max_attempts, recovery_policy, idempotency_key,
     sequence, depends_on)
SELECT t.queue, t.kind, t.payload::jsonb, t.priority,
       coalesce(t.run_at, pg_catalog.now() + pg_catalog.make_interval(secs => t.delay_seconds)),
       t.max_attempts, t.recovery_policy, t.idempotency_key,
       t.sequence, t.depends_on::bigint[]
FROM unnest(
    %(queues)b::text[], %(kinds)b::text[], %(payloads)b::text[], %(priorities)b::int[],
    %(run_ats)b::timestamptz[], %(delays)b::float8[], %(max_attempts)b::int[],
    %(recovery_policies)b::text[], %(idempotency_keys)b::text[], %(sequences)b::text[],
    %(depends_on)b::text[]
) AS t(queue, kind, payload, priority, run_at, delay_seconds, max_attempts,
       recovery_policy, idempotency_key, sequence, depends_on)
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running')
    DO NOTHING
RETURNING id;

-- name: job_extend_leases :many
-- Heartbeat for every job a run holds, in one statement. A job not returned has lost its lease.
UPDATE pgdrain.active_jobs AS j
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

-- name: job_status_many :many
-- The status of these jobs now (a deleted job has no row): why a run lost the lease of an
-- attempt (an operator's `pgdrain cancel`, or another attempt owns the job), and what
-- `pgdrain cancel` found already finished. By primary key; only reads.
SELECT id, status FROM pgdrain.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_complete_and_claim :many
-- The drain's one round trip: mark the jobs this run finished done, then claim up to
-- %(limit)s ready jobs, the queues taking turns (round-robin, priority order within a turn)
-- and each limited queue (pgdrain.queue_limits) kept within its running limit and its rate
-- across all runs; a paused queue's jobs are not claimed. SKIP LOCKED lets concurrent drains
-- pass each other.
-- A finished job returned as lost had lost its lease: its result is not recorded, and
-- completed_token keeps the token of the attempt whose result was. A claimed lease never
-- reaches past the run's deadline (cap_seconds; NULL = no cap), measured on the database's
-- clock. One statement, so one commit, for both.
WITH ended AS (
    -- A finished job leaves active_jobs for finished_jobs in this statement (the INSERT below).
    DELETE FROM pgdrain.active_jobs AS j
    -- The fence: only the attempt whose token this run holds (each attempt's token is a
    -- random UUID of its own, so matching the id and the token each against the lists is
    -- matching the pair). A short list is compared in turn; from 100 pairs on they are hashed,
    -- once, when a row first asks: comparing each row with every token grows with the square
    -- of the batch, and a hash of a few pairs costs more than it saves.
    -- Written so that the plan, generic, reads these rows by primary key.
    WHERE j.id = ANY(%(done_ids)b::bigint[])
      AND CASE WHEN j.status = 'running' THEN CASE
          WHEN cardinality(%(done_tokens)b::uuid[]) < 100 THEN j.attempt_token = ANY(%(done_tokens)b::uuid[])
          ELSE (j.id, j.attempt_token) IN (SELECT * FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]))
      END END
    RETURNING j.*
), moved AS (
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    SELECT j.id, j.queue, j.kind, j.payload, 'done', j.priority, j.run_at, j.attempts,
           j.max_attempts, j.recovery_policy, j.reclaim_count, j.idempotency_key, NULL,
           j.created_at, now(), now(), j.attempt_token AS completed_token, j.errors,
           j.sequence, j.depends_on, j.has_dependents, j.output, j.progress
    FROM ended AS j
    -- Done jobs not kept (%(keep_done)s false: PGDRAIN_RETAIN_DONE=0) end with the DELETE,
    -- save one whose finish releases another: its sequence's next job and its dependents are
    -- released by its row's arrival here (jobs_flow_finished), and the dependents read its output.
    WHERE %(keep_done)s OR j.sequence IS NOT NULL OR j.has_dependents
), completed AS (
    -- Every attempt the DELETE took, moved or not (a data-modifying CTE runs in full unread).
    SELECT j.id, j.queue, j.attempt_token AS token FROM ended AS j
), served AS MATERIALIZED (
    -- The queues this claim serves: %(queues)s, or when it is NULL (the run serves every
    -- queue) each queue with a floor (migration 0026; a queue without one has no queued job):
    -- the same list in every statement that takes NULL for every queue (a unit test keeps them
    -- in step).
    SELECT coalesce(%(queues)s::text[],
                    ARRAY(SELECT f.queue FROM pgdrain.queue_floors AS f ORDER BY f.queue)) AS names,
           -- Of the queues named, those the run holds a position in (it claimed there lately):
           -- the share below divides the batch among them for them.
           (SELECT count(*) FROM unnest(%(queues)s::text[]) AS n(queue)
            WHERE n.queue = ANY(%(position_queue)s::text[]))::int AS positioned
), limits AS MATERIALIZED (
    -- Per-queue settings across all runs (pgdrain.queue_limits; most queues have none, and
    -- then nothing is locked): a concurrency limit (free: NULL when none), a rate limit
    -- (starts_left in the current window: NULL when none) and a pause. The row lock serialises
    -- the claims of such a queue, and reads the running count (moved by the count trigger) and
    -- the window's claims (counted below) as the last claim committed them. A window the row
    -- holds later than this claim's own counts as the current one.
    SELECT l.queue, l.paused_at IS NOT NULL AS paused, l.max_running - l.running AS free,
           l.rate_limit - CASE WHEN l.window_start >= pgdrain.rate_window(l.rate_seconds)
                               THEN l.window_started ELSE 0 END AS starts_left
    FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY((SELECT names FROM served)::text[])
    ORDER BY l.queue
    FOR UPDATE OF l
), slots AS (
    -- How many each queue may claim now: the batch, or its free slots (with the jobs this
    -- statement completes, whose counts the trigger moves only at its end), or the starts its
    -- window has left, none while it is paused; and where the run left off in it
    -- (runner/positions.py): the key of the last job it claimed there, or NULL.
    SELECT q.name,
           CASE WHEN lim.paused THEN 0 ELSE least(%(limit)s, greatest(0, coalesce(
               lim.free + (SELECT count(*) FROM completed AS c WHERE c.queue = q.name)::int,
               %(limit)s)), greatest(0, coalesce(lim.starts_left, %(limit)s)),
               -- Of queues named (a run's next claims name those its last one found jobs in),
               -- each locks a share of the batch, not all of it: round-robin keeps a batch,
               -- and R queues each locking a batch locked R x batch rows for it (a red team's
               -- 1,000 queues: 10,000 row locks a claim of 10). The share fills the batch
               -- whenever each queue named has a job ready (share + R - 1 >= batch). A run of
               -- every queue (NULL) finds the queues itself and takes no share: named queues
               -- left empty would make its claims short (decision 0020).
               -- A queue the run holds a position in shares the batch among those it holds
               -- one in only: with PGDRAIN_QUEUES naming 40 queues and jobs in one, a share
               -- among all 40 claimed 1 job at a time, for good. The others keep the share
               -- among all named: the locks stay a few batches at most.
               CASE WHEN %(queues)s::text[] IS NULL THEN %(limit)s
                    WHEN pos.queue IS NOT NULL THEN greatest(
                   ceil(4.0 * %(limit)s / greatest(1, (SELECT positioned FROM served)))::int,
                   %(limit)s - (SELECT positioned FROM served) + 1)
                    ELSE greatest(
                   ceil(4.0 * %(limit)s / greatest(1, cardinality(%(queues)s::text[])))::int,
                   %(limit)s - cardinality(%(queues)s::text[]) + 1) END) END AS n,
           pos.priority AS after_priority,
           -- The position's run_at as the claim's reply gave it, microseconds since the epoch
           -- (no session setting reads a bigint), made a timestamptz again exactly: whole
           -- seconds, then the rest (interval * float8 is exact for both parts).
           'epoch'::timestamptz + (pos.run_at_us / 1000000) * interval '1 second'
               + mod(pos.run_at_us, 1000000) * interval '1 microsecond' AS after_run_at,
           pos.id AS after_id
    FROM unnest((SELECT names FROM served)::text[]) AS q(name)
    LEFT JOIN limits AS lim ON lim.queue = q.name
    LEFT JOIN unnest(%(position_queue)s::text[], %(position_priority)s::int[],
                     %(position_run_at_us)s::bigint[], %(position_id)s::bigint[])
         AS pos(queue, priority, run_at_us, id) ON pos.queue = q.name
), positioned AS MATERIALIZED (
    -- A queue with a position: the rest of that priority's ready jobs after it, a range of
    -- jobs_ready_idx bounded on both sides. The entries of the jobs the run claimed before it
    -- (dead, but kept while any snapshot may see them) are not walked again. Written as a
    -- bound on the index's last three columns, the scan starts at the position (with
    -- `priority = p` the scan would start at the priority's first entry) and no other index
    -- can take it (jobs_queued_run_at_idx would start at the position's run_at and walk every
    -- entry that shares it: a batch enqueued in one transaction shares one).
    SELECT q.name, c.id, c.priority, c.run_at, c.bytes
    FROM slots AS q
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at, octet_length(payload::text) AS bytes
        FROM pgdrain.active_jobs
        WHERE status = 'queued'
          AND queue = q.name
          AND (priority, run_at, id) > (q.after_priority, q.after_run_at, q.after_id)
          AND priority <= q.after_priority
          AND run_at <= now()
        ORDER BY priority, run_at, id
        LIMIT q.n
        FOR UPDATE SKIP LOCKED
    ) AS c
), found AS (
    -- Per queue, so that each scan walks jobs_ready_idx in order and stops at the limit
    -- (`queue = ANY(...)` would sort every ready row first).
    SELECT q.name AS queue, candidate.id, candidate.priority, candidate.run_at, candidate.bytes
    FROM slots AS q
    CROSS JOIN LATERAL (
        SELECT p.id, p.priority, p.run_at, p.bytes FROM positioned AS p WHERE p.name = q.name
        UNION ALL
        -- From the start of the queue: a queue without a position, or one whose range above
        -- ran out before the limit (the next priority, a job that sorts before the position).
        SELECT from_start.*
        FROM (SELECT count(*)::int AS found FROM positioned AS p WHERE p.name = q.name) AS pos
        -- Where the queue's queued jobs start (migration 0026): none sorts before the floor's
        -- key, none has a run_at before ready_from, and a queue without a floor has none. Read
        -- only when the position's range fell short: behind a held snapshot the floor's table
        -- keeps a dead version of each raise, which a claim from a position need not read.
        CROSS JOIN LATERAL (
            SELECT f.priority, f.run_at, f.id, f.ready_from
            -- The floor is read through `needed`, so the nested loop reads none when it is
            -- empty. OFFSET 0 keeps it a subquery of its own: pulled up, its condition became a
            -- filter the planner put beside the count, and it read the floor first (PG 16).
            FROM (SELECT q.name AS queue WHERE q.n > pos.found OFFSET 0) AS needed
            -- The queue's floor, probed in its marks' index (as pgdrain.queue_floors gives it
            -- for one queue: that view, joined here, was built whole for every queue served,
            -- O(queues²) a claim; a red team stalled a run of 20,000 queues on it).
            CROSS JOIN LATERAL (
                SELECT m.priority, m.run_at, m.id,
                       (SELECT min(r.ready_from) FROM pgdrain.queue_floor_marks AS r
                        WHERE r.queue = needed.queue) AS ready_from
                FROM pgdrain.queue_floor_marks AS m
                WHERE m.queue = needed.queue
                ORDER BY m.priority, m.run_at, m.id
                LIMIT 1
            ) AS f
        ) AS f
        -- A queue with nothing ready is passed over after one probe of jobs_queued_run_at_idx;
        -- without it the scan below walks every delayed row of the queue before finding nothing
        -- (the run's last, empty claim).
        CROSS JOIN LATERAL (
            SELECT 1 FROM pgdrain.active_jobs
            WHERE pos.found < q.n
              AND status = 'queued'
              AND queue = q.name
              AND run_at >= f.ready_from
              AND run_at <= now()
            ORDER BY run_at
            LIMIT 1
        ) AS has_ready
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at, octet_length(payload::text) AS bytes
            FROM pgdrain.active_jobs
            WHERE status = 'queued'
              AND queue = q.name
              -- From the floor: not through the dead entries of the jobs claimed before it,
              -- kept while a snapshot held open elsewhere may see them (decision 0017).
              AND (priority, run_at, id) >= (f.priority, f.run_at, f.id)
              AND run_at <= now()
              -- not the position's range, read in full above
              AND NOT coalesce(priority = q.after_priority
                               AND (run_at, id) > (q.after_run_at, q.after_id), false)
            ORDER BY priority, run_at, id
            LIMIT q.n - pos.found
            FOR UPDATE SKIP LOCKED
        ) AS from_start
    ) AS candidate
), candidates AS (
    SELECT f.id, f.priority, f.run_at, f.bytes, row_number() OVER turns AS turn,
           md5(f.queue || %(claim_id)s::uuid::text) AS spin
    FROM found AS f
    WINDOW turns AS (PARTITION BY f.queue ORDER BY f.priority, f.run_at, f.id)
    -- Fair across queues (round-robin): every queue's first candidate comes before any queue's
    -- second, so a backlog in one queue cannot make a new job in another wait behind all of it;
    -- priority orders the jobs within a turn, then the queues in an order each claim draws
    -- anew (its claim id, hashed with the queue's name): a turn of more queues than the claim
    -- takes picks some of them, not those with the oldest heads every time (by age, a new job
    -- waited behind every busy queue's whole backlog, a red team's finding).
    ORDER BY
        row_number() OVER (PARTITION BY f.queue ORDER BY f.priority, f.run_at, f.id),
        f.priority, md5(f.queue || %(claim_id)s::uuid::text), f.run_at, f.id
    LIMIT %(limit)s
), ready AS (
    -- One claim brings at most 4 MiB of payload text (as stored) into the run, and always its
    -- first job: a queue of large payloads cannot make a batch exhaust the function's memory
    -- (store.MAX_CLAIM_PAYLOAD_BYTES; a row holds at most 1 MiB, jobs_payload_size_chk). A
    -- claim cut short makes the run claim again as its jobs finish.
    SELECT c.id
    FROM (SELECT c.id,
                 sum(c.bytes) OVER (ORDER BY c.turn, c.priority, c.spin, c.run_at, c.id)
                     - c.bytes AS before
          FROM candidates AS c) AS c
    WHERE c.before < 4194304  -- the claim's payload bound
), claimed AS (
    UPDATE pgdrain.active_jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        attempt_token = gen_random_uuid(),
        claim_id = %(claim_id)s,
        leased_by = %(worker)s,
        heartbeat_at = now(),
        lease_expires_at = now() + least(make_interval(secs => %(lease_seconds)s),
                                         make_interval(secs => %(cap_seconds)s)),
        updated_at = now()
    -- An array of ids keeps the primary-key lookup (a join with `ready` may be planned as a
    -- hash of the whole table).
    WHERE j.id = ANY(ARRAY(SELECT id FROM ready))
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.run_at, j.attempts,
              j.max_attempts, j.attempt_token
), counted AS (
    -- The claims of each rate-limited queue, added to its window (moved forward to this
    -- claim's, never back: a later window a concurrent claim committed keeps them), under the
    -- row lock taken above. No row is read without a rate.
    UPDATE pgdrain.queue_limits AS l
    SET window_start = greatest(l.window_start, pgdrain.rate_window(l.rate_seconds)),
        window_started = CASE WHEN l.window_start >= pgdrain.rate_window(l.rate_seconds)
                              THEN l.window_started ELSE 0 END
                         + (SELECT count(*) FROM claimed AS c WHERE c.queue = l.queue)::int
    WHERE l.queue = ANY(ARRAY(SELECT lim.queue FROM limits AS lim
                              WHERE lim.starts_left IS NOT NULL))
)
-- Of the finished attempts only those the fence refused come back (rarely any), so the one
-- thread that talks to the database decodes only the claim's rows. The payload comes back as
-- text: the job's own worker thread parses
-- it, off that thread.
SELECT true AS lost, held.id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, held.token AS attempt_token,
       NULL::int AS priority, NULL::bigint AS run_at_us
FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]) AS held(id, token)
WHERE NOT EXISTS (SELECT 1 FROM completed AS c WHERE c.id = held.id AND c.token = held.token)
UNION ALL
-- Each paused queue, flagged (lost NULL, kind 'paused'): the run gives back what it holds of
-- it unstarted. Every paused queue, not only those %(queues)s names: a run of every queue
-- names the queues it found queued jobs in, and a queue whose last jobs it claimed ahead is no
-- longer among them. No row unless a queue is paused (a few rows at most).
SELECT NULL, NULL, p.queue, 'paused', NULL, NULL, NULL, NULL, NULL, NULL
FROM pgdrain.queue_limits AS p
WHERE p.paused_at IS NOT NULL
UNION ALL
-- run_at, the claim's position (runner/positions.py), as exact microseconds since the epoch
-- (extract's epoch is numeric): a timestamptz is read in the session's DateStyle, which a
-- role's own default can make one the reply's reader cannot parse.
(SELECT false, id, queue, kind, payload::text, attempts, max_attempts, attempt_token,
        priority, (extract(epoch FROM run_at) * 1000000)::bigint AS run_at_us
 FROM claimed
 ORDER BY priority, run_at, id)
UNION ALL
-- The queues it found itself (%(queues)s NULL) that had jobs to claim, a row each (lost NULL):
-- the run names them in its next claims for a while (POSITION_MAX_AGE), rather than read every
-- queue's floor at every claim. Not those it found nothing in: a queue whose jobs are gone
-- keeps its floor's marks until a raise folds them in, and a run of every queue, naming
-- thousands of such queues, probed each at every claim (a red team's 5,000 of them).
SELECT NULL, NULL, s.name, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM (SELECT DISTINCT f.queue AS name FROM found AS f) AS s
WHERE %(queues)s::text[] IS NULL;

-- name: job_claim_recover :many
-- After a lost reply (the connection broke once a statement was sent): what the claim
-- %(claim_id)s already did, if it committed. First the attempts it was to complete that are
-- recorded done (completed_token holds the accepted attempt's token), then the jobs it claimed
-- that still run under it (a later claim by anyone overwrites claim_id), found among the running
-- rows (jobs_lease_idx): claim_id has no index, which every claim would pay for (migration
-- 0011). Only reads: safe to repeat. A NULL claim id asks about completions alone.
SELECT true AS completed, j.id, NULL::text AS queue, NULL::text AS kind, NULL::text AS payload,
       NULL::int AS attempts, NULL::int AS max_attempts, held.token AS attempt_token,
       NULL::int AS priority, NULL::bigint AS run_at_us
FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]) AS held(id, token)
JOIN pgdrain.jobs AS j ON j.id = held.id
-- By primary key, as the completions are: no partial index of finished rows.
WHERE j.id = ANY(%(done_ids)b::bigint[])
  AND CASE WHEN j.status = 'done' THEN j.completed_token END = held.token
UNION ALL
-- Done jobs not kept (%(keep_done)s false): a completion deletes the job, so no row says it.
-- While any of these attempts still holds its job (its token is on the row), the statement
-- did not commit, and a job gone meanwhile was finished by another attempt: lost. When none
-- does, it committed, and each job gone from both tables was completed by it. (Or the lease of
-- every one was lost and each job finished under another attempt: then none is ours to
-- complete, and counting them done strands nothing.)
SELECT true, held.id, NULL, NULL, NULL, NULL, NULL, held.token, NULL, NULL
FROM unnest(%(done_ids)b::bigint[], %(done_tokens)b::uuid[]) AS held(id, token)
WHERE NOT %(keep_done)s
  AND NOT EXISTS (SELECT 1 FROM pgdrain.jobs AS j WHERE j.id = held.id)
  AND NOT EXISTS (SELECT 1 FROM pgdrain.active_jobs AS still
                  WHERE still.id = ANY(%(done_ids)b::bigint[])
                    AND still.attempt_token = ANY(%(done_tokens)b::uuid[]))
UNION ALL
(SELECT false, id, queue, kind, payload::text, attempts, max_attempts, attempt_token,
        priority, (extract(epoch FROM run_at) * 1000000)::bigint AS run_at_us  -- as the claim's
 FROM pgdrain.active_jobs
 WHERE claim_id = %(claim_id)s
   AND status = 'running'
 ORDER BY priority, run_at, id);

-- name: job_complete_many :many
-- Mark finished jobs done without claiming (the run's last flush), moving them to finished_jobs.
-- The same statement as the `ended` and `completed` parts of job_complete_and_claim; a unit test
-- keeps the two in step.
WITH ended AS (
    DELETE FROM pgdrain.active_jobs AS j
    WHERE j.id = ANY(%(ids)b::bigint[])
      AND CASE WHEN j.status = 'running' THEN CASE
          WHEN cardinality(%(tokens)b::uuid[]) < 100 THEN j.attempt_token = ANY(%(tokens)b::uuid[])
          ELSE (j.id, j.attempt_token) IN (SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]))
      END END
    RETURNING j.*
), moved AS (
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    SELECT j.id, j.queue, j.kind, j.payload, 'done', j.priority, j.run_at, j.attempts,
           j.max_attempts, j.recovery_policy, j.reclaim_count, j.idempotency_key, NULL,
           j.created_at, now(), now(), j.attempt_token AS completed_token, j.errors,
           j.sequence, j.depends_on, j.has_dependents, j.output, j.progress
    FROM ended AS j
    WHERE %(keep_done)s OR j.sequence IS NOT NULL OR j.has_dependents
)
SELECT j.id, j.attempt_token AS token FROM ended AS j;

-- name: job_fail :one
-- A failed attempt: retry at now() + delay, or `failed` once attempts reach max_attempts
-- (or at once when %(final)s: discarded; `cancelled` instead when %(cancelled)s, the job's
-- own Cancel, the state an operator's `pgdrain cancel` leaves too). A snooze
-- (%(spend_attempt)s false) gives the attempt back, keeps last_error (the latest real error:
-- a snooze is none) and is queued whatever attempts are left. %(error_record)s (a JSON
-- object, or NULL for a snooze) is appended to the job's error history with the attempt
-- number and the database's time, in this same fenced statement; the history keeps the
-- latest 50. A failed or cancelled job moves to finished_jobs in this statement.
WITH retried AS (
    -- Queued again (or snoozed): the job stays in active_jobs.
    UPDATE pgdrain.active_jobs AS j
    SET status = 'queued',
        run_at = now() + make_interval(secs => %(delay_seconds)s),
        finished_at = NULL,
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
      AND NOT (%(cancelled)s OR %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts))
    RETURNING j.id, j.status, j.attempts, j.run_at
), ended AS (
    -- Failed or cancelled: the job leaves active_jobs for finished_jobs in this statement.
    DELETE FROM pgdrain.active_jobs AS j
    WHERE j.id = %(id)s
      AND CASE WHEN j.status = 'running' THEN j.attempt_token END = %(token)s
      AND (%(cancelled)s OR %(final)s OR (%(spend_attempt)s AND j.attempts >= j.max_attempts))
    RETURNING j.*
), finished AS (
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    SELECT j.id, j.queue, j.kind, j.payload,
           CASE WHEN %(cancelled)s THEN 'cancelled' ELSE 'failed' END,
           j.priority, j.run_at,
           CASE WHEN %(spend_attempt)s THEN j.attempts ELSE j.attempts - 1 END,
           j.max_attempts, j.recovery_policy, j.reclaim_count, j.idempotency_key,
           CASE WHEN %(spend_attempt)s THEN %(error)s ELSE j.last_error END,
           j.created_at, now(), now(), j.completed_token,
           CASE WHEN %(error_record)s::jsonb IS NULL THEN j.errors
                ELSE (CASE WHEN jsonb_array_length(j.errors) >= 50 THEN j.errors - 0
                           ELSE j.errors END)
                     || jsonb_build_array(%(error_record)s::jsonb
                                          || jsonb_build_object('attempt', j.attempts,
                                                                'at', now()))
           END,
           j.sequence, j.depends_on, j.has_dependents, j.output, j.progress
    FROM ended AS j
    RETURNING id, status, attempts, run_at
)
SELECT id, status, attempts, run_at FROM retried
UNION ALL
SELECT id, status, attempts, run_at FROM finished;

-- name: job_release_many :many
-- Give back claimed jobs that never started: queued again, the attempt not spent.
UPDATE pgdrain.active_jobs AS j
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

-- name: job_release_stopped :many
-- The run stops on a stop request (SIGTERM, SIGINT) with these jobs still running, their grace
-- over. Policy auto: queued again at once with the attempt given back, as job_release_many
-- gives back an unstarted one, and the stop joins the error history (last_error keeps the last
-- real error, as a snooze does): a stop is the operator's (a rolling deploy), not the job's,
-- and must not use up its attempts. It counts as a reclaim, and only while the job's reclaims
-- are fewer than its attempts: a job cut short every time (longer than every deploy's
-- interval, evicted for its memory) must still end. Not here: policy manual, or past that
-- bound (the caller ends the lease; the reclaim spends the attempt, or parks the job). Fenced
-- by token: an attempt given back already matches nothing, so it is safe to repeat.
UPDATE pgdrain.active_jobs AS j
SET status = 'queued',
    attempts = j.attempts - 1,
    reclaim_count = j.reclaim_count + 1,
    run_at = now(),
    errors = (CASE WHEN jsonb_array_length(j.errors) >= 50 THEN j.errors - 0 ELSE j.errors END)
             || jsonb_build_array(jsonb_build_object(
                    'message', %(message)s::text, 'type', 'Stopped', 'traceback', NULL,
                    'attempt', j.attempts, 'at', now())),
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    updated_at = now()
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]) AS held(id, token)
WHERE j.id = ANY(%(ids)b::bigint[])
  AND j.id = held.id
  AND CASE WHEN j.status = 'running' THEN j.attempt_token END = held.token
  AND j.recovery_policy = 'auto'
  AND j.reclaim_count < j.max_attempts
RETURNING j.id, held.token;

-- name: floors_raise :exec
-- Raise the floors a run's scans start from: of running jobs' leases (migration 0024) to the
-- least lease a running job holds, and of each queue (migration 0026) to its first queued job,
-- each unless a statement writing such a row is in flight. Sent as a transaction of its own,
-- before the reclaim in the same round trip (runner/reclaim.py): it holds its locks until it
-- commits. Safe to repeat: it computes each floor again from the jobs as they are.
SELECT pgdrain.lease_floor_raise(), pgdrain.queue_floors_raise();

-- name: job_reclaim_expired :many
-- Take back running jobs whose lease expired: queued again when the policy is auto and
-- attempts remain, failed when they are spent (a job that kills its worker every time must
-- end), parked when the policy is manual (a person decides: `pgdrain retry ID`). The attempt
-- lost joins the error history as job_fail's do (type LeaseExpired, the latest 50 kept).
WITH expired AS (
    SELECT id, attempt_token
    FROM pgdrain.active_jobs
    WHERE status = 'running'
      -- From the floor no running job's lease is below (migration 0024): not through the dead
      -- entries of every job that ran since a snapshot held open elsewhere began.
      AND lease_expires_at >= coalesce((SELECT f.at FROM pgdrain.lease_floor AS f), '-infinity')
      AND lease_expires_at < now()
    ORDER BY lease_expires_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), requeued AS (
    -- Queued again or parked: the job stays in active_jobs.
    UPDATE pgdrain.active_jobs AS j
    SET status = CASE WHEN j.recovery_policy = 'manual' THEN 'parked' ELSE 'queued' END,
        run_at = CASE WHEN j.recovery_policy = 'auto' THEN now() ELSE j.run_at END,
        -- A parked job is not finished: retention never deletes it.
        finished_at = NULL,
        reclaim_count = j.reclaim_count + 1,
        last_error = 'lease expired before completion (attempt ' || j.attempts || ' of '
                     || j.max_attempts || ', held by ' || j.leased_by || ')',
        errors = (CASE WHEN jsonb_array_length(j.errors) >= 50 THEN j.errors - 0
                       ELSE j.errors END)
                 || jsonb_build_array(jsonb_build_object(
                        'message', 'lease expired before completion (attempt ' || j.attempts
                                   || ' of ' || j.max_attempts || ', held by ' || j.leased_by
                                   || ')',
                        'type', 'LeaseExpired', 'traceback', NULL,
                        'attempt', j.attempts, 'at', now())),
        lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
        updated_at = now()
    FROM expired
    -- By primary key, the fence in a CASE, as the completions are: planned as a join on
    -- running rows, the generic plan walked all of jobs_lease_idx for the rows to join (behind
    -- a held snapshot, the dead entry of every job that ran since; decision 0017).
    WHERE j.id = ANY(ARRAY(SELECT e.id FROM expired AS e))
      AND j.id = expired.id
      AND CASE WHEN j.status = 'running' THEN j.attempt_token END = expired.attempt_token
      AND (j.recovery_policy = 'manual' OR j.attempts < j.max_attempts)
    RETURNING j.id, j.status, j.reclaim_count
), ended AS (
    -- Attempts spent: failed, and moved to finished_jobs in this statement.
    DELETE FROM pgdrain.active_jobs AS j
    USING expired
    WHERE j.id = ANY(ARRAY(SELECT e.id FROM expired AS e))  -- as above
      AND j.id = expired.id
      AND CASE WHEN j.status = 'running' THEN j.attempt_token END = expired.attempt_token
      AND j.recovery_policy = 'auto' AND j.attempts >= j.max_attempts
    RETURNING j.*
), failed AS (
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    SELECT j.id, j.queue, j.kind, j.payload, 'failed', j.priority, j.run_at, j.attempts,
           j.max_attempts, j.recovery_policy, j.reclaim_count + 1, j.idempotency_key,
           'lease expired before completion (attempt ' || j.attempts || ' of '
           || j.max_attempts || ', held by ' || j.leased_by || ')',
           j.created_at, now(), now(), j.completed_token,
           (CASE WHEN jsonb_array_length(j.errors) >= 50 THEN j.errors - 0 ELSE j.errors END)
           || jsonb_build_array(jsonb_build_object(
                  'message', 'lease expired before completion (attempt ' || j.attempts
                             || ' of ' || j.max_attempts || ', held by ' || j.leased_by || ')',
                  'type', 'LeaseExpired', 'traceback', NULL,
                  'attempt', j.attempts, 'at', now())),
           j.sequence, j.depends_on, j.has_dependents, j.output, j.progress
    FROM ended AS j
    RETURNING id, status, reclaim_count
)
SELECT id, status, reclaim_count FROM requeued
UNION ALL
SELECT id, status, reclaim_count FROM failed;

-- name: queue_has_ready :one
-- Is anything ready and claimable in these queues (NULL: in any queue)? Decides whether a run
-- out of budget continues itself. One probe per queue of the range from its floor's ready_from
-- (migration 0026) to now() in jobs_queued_run_at_idx (as `queue = ANY(...)` the planner may
-- choose a sequential scan through the history); every queue is found as the claim finds them.
SELECT EXISTS (
    SELECT 1
    FROM unnest(coalesce(%(queues)s::text[],
                         ARRAY(SELECT f.queue FROM pgdrain.queue_floors AS f ORDER BY f.queue)))
         AS q(name)
    -- Without a floor (NULL), nothing is queued. Probed per queue in the marks' index: a join
    -- with the view may be planned as a loop over it, O(queues²).
    CROSS JOIN LATERAL (
        SELECT min(m.ready_from) AS ready_from FROM pgdrain.queue_floor_marks AS m
        WHERE m.queue = q.name
    ) AS f
    CROSS JOIN LATERAL (
        SELECT 1 FROM pgdrain.active_jobs
        WHERE status = 'queued'
          AND queue = q.name
          AND run_at >= f.ready_from
          AND run_at <= now()
        ORDER BY run_at
        LIMIT 1
    ) AS one
    -- Nor in a queue no run may claim now: paused, or its rate window used up.
    WHERE NOT EXISTS (
        SELECT 1 FROM pgdrain.queue_limits AS l
        WHERE l.queue = q.name
          AND (l.paused_at IS NOT NULL
               OR (l.window_started >= l.rate_limit
                   AND l.window_start >= pgdrain.rate_window(l.rate_seconds)))
    )
) AS ready;

-- name: job_record_many :many
-- What running attempts recorded (migration 0021): each one's output (the value its function
-- returned) and latest progress, as JSON text, NULL where it recorded none. Sent only for
-- attempts that recorded something: before the completion of an attempt with an output, and
-- with the heartbeat for progress. Fenced as the completions are: a stale attempt writes
-- nothing.
UPDATE pgdrain.active_jobs AS j
SET output = coalesce(t.output::jsonb, j.output),
    progress = coalesce(t.progress::jsonb, j.progress)
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[], %(outputs)b::text[], %(progress)b::text[])
     AS t(id, token, output, progress)
WHERE j.id = ANY(%(ids)b::bigint[])
  AND j.id = t.id
  AND CASE WHEN j.status = 'running' THEN j.attempt_token END = t.token
RETURNING j.id, t.token;
