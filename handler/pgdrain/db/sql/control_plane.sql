-- The statements of kicks, the runs table, wake-ups, per-queue limits, the backlog a run
-- leaves, and retention (db/store/control_plane.py).
-- Statements pgdrain runs against the queue, each under a `-- name: NAME :SHAPE` line.
-- NAME is also the name of the pgdrain.db.store function that runs it (noun first, verb last, as
-- River names its queries). SHAPE is what the statement gives back: :one (at most one row),
-- :many (rows), :rowcount (only how many rows it changed), :exec (nothing).
-- Loaded once by pgdrain.db.sql; executed only by pgdrain.db.store.
-- Parameters are always bound (%(name)s); nothing here is ever formatted into a string.
-- Every statement after the claim is fenced by attempt_token: a fence condition stands on
-- a line of its own so that tests can derive the unfenced control from the real statement.

-- name: job_retention_batch :one
-- One retention batch of rows, in one statement: at most %(done_limit)s done jobs finished more
-- than %(done_days)s days ago, and at most %(failed_limit)s failed or cancelled ones finished
-- more than %(failed_days)s days ago (parked jobs wait for a person: never), each from where it
-- is: finished_jobs_failed, the default partition of done jobs (a day whose partition was
-- missing), and the finished rows migration 0018 left in active_jobs until they move. Done jobs
-- in their day's partition go with the partition (finished_jobs_partition_drop), not here.
-- Returns how many of each went (a count short of its limit means that kind is done), and
-- `due`: whether partitions are to be made or dropped, or history to be moved
-- (retention.run_once then carries on); and at most %(runs_limit)s lines of
-- pgdrain.run_history older than %(done_days)s days (a run is kept as long as the done jobs it
-- ran; with done jobs not kept, 0 days, as long as failed ones: its lines are then the only
-- count of done jobs); and at most %(runs_limit)s kick rows idle for a day. Safe to run twice:
-- a deleted row matches nothing. The
-- rows go by id (an array of ids, as the claim's), whatever the generic plan guesses of the
-- cutoff (`id IN (...)` may be planned as a sequential scan). An age's days are 24 hours each:
-- a day of the session's TimeZone is 23 or 25 hours across a change of summer time.
WITH done_left AS (
    DELETE FROM pgdrain.active_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.active_jobs
        WHERE status IN ('done', 'failed', 'cancelled')  -- finished rows only, whatever follows
          AND status = 'done' AND finished_at < now() - %(done_days)s * interval '24 hours'
        LIMIT %(done_limit)s
    ))
      AND status = 'done'
    RETURNING 1
), done_default AS (
    DELETE FROM pgdrain.finished_jobs_done_default
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.finished_jobs_done_default
        WHERE finished_at < now() - %(done_days)s * interval '24 hours'
        LIMIT %(done_limit)s
    ))
      AND finished_at < now() - %(done_days)s * interval '24 hours'
    RETURNING 1
), failed_left AS (
    DELETE FROM pgdrain.active_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.active_jobs
        WHERE status IN ('done', 'failed', 'cancelled')
          AND status IN ('failed', 'cancelled')
          AND finished_at < now() - %(failed_days)s * interval '24 hours'
        LIMIT %(failed_limit)s
    ))
      AND status IN ('failed', 'cancelled')
    RETURNING 1
), failed AS (
    -- Not a job cancelled while it ran whose lease has not ended (job_purge_finished says why).
    DELETE FROM pgdrain.finished_jobs_failed
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.finished_jobs_failed
        WHERE finished_at < now() - %(failed_days)s * interval '24 hours'
          AND NOT coalesce(cancelled_lease_expires_at > now(), false)
        LIMIT %(failed_limit)s
    ))
      AND finished_at < now() - %(failed_days)s * interval '24 hours'
      AND NOT coalesce(cancelled_lease_expires_at > now(), false)
    RETURNING 1
), runs AS (
    DELETE FROM pgdrain.run_history
    WHERE run_id = ANY(ARRAY(
        SELECT run_id FROM pgdrain.run_history
        WHERE finished_at < now() - CASE WHEN %(done_days)s::float8 > 0 THEN %(done_days)s::float8
                                         ELSE %(failed_days)s::float8 END * interval '24 hours'
        ORDER BY finished_at
        LIMIT %(runs_limit)s
    ))
    RETURNING 1
), idle_kicks AS (
    -- A queue's kick row that nothing kicked or held for a day: a run of every queue renews
    -- every row at its registration, its holds and its exit, so the rows of queues no longer
    -- kicked (a tenant gone, names in an event sent by hand) would cost every run for good.
    -- Deleted, the next kick of that queue makes its row again and invokes. A row a kick or a
    -- run has locked is passed over (SKIP LOCKED; queue order, as every statement on them).
    DELETE FROM pgdrain.kicks AS k
    WHERE k.queue = ANY(ARRAY(
        SELECT i.queue FROM pgdrain.kicks AS i
        WHERE i.kicked_at < now() - interval '1 day'
          AND i.requested_at < now() - interval '1 day'
          AND (i.run_until IS NULL OR i.run_until < now() - interval '1 day')
        ORDER BY i.queue
        LIMIT %(runs_limit)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING 1
)
SELECT (SELECT count(*) FROM done_left) + (SELECT count(*) FROM done_default) AS done,
       (SELECT count(*) FROM failed_left) + (SELECT count(*) FROM failed) AS failed,
       (SELECT count(*) FROM runs) AS runs,
       pgdrain.finished_jobs_partition_due(%(done_days)s::float8) AS due;

-- name: finished_jobs_partition_limits :exec
-- Retention's partition step, in a transaction of its own: its lock waits limited to
-- %(lock_timeout_ms)s (a DETACH or ATTACH that waits for a reader makes completions queue
-- behind it), its statement to %(statement_timeout_ms)s, what the budget leaves: making a day's
-- partition beside a large default partition scans that partition, which no lock wait limit
-- should cut (a red team saw every run give up on it, and the default grow with every day).
SELECT pg_catalog.set_config('lock_timeout', %(lock_timeout_ms)s::text, true),
       pg_catalog.set_config('statement_timeout', %(statement_timeout_ms)s::text, true);

-- name: finished_jobs_partition_keep :one
-- Partition housekeeping: make the day partitions of done jobs from today to the day after
-- tomorrow (UTC) that are missing, and drop those whose every job finished more than
-- %(done_days)s days ago (NULL: drop none; `pgdrain migrate`). Safe to run twice and concurrently (the functions serialise on one
-- advisory lock, and find made what is made, gone what is gone). Returns how many of each.
SELECT pgdrain.finished_jobs_partition_ensure_ahead() AS made,
       CASE WHEN %(done_days)s::float8 IS NULL THEN 0
            ELSE pgdrain.finished_jobs_partition_drop(%(done_days)s::float8) END AS dropped;

-- name: job_history_move :one
-- Move one batch of the finished rows migration 0018 left in active_jobs to finished_jobs,
-- each in one statement (the view shows each row once, before and after). Returns how many:
-- fewer than %(limit)s means none is left. Safe to run twice: a moved row matches nothing.
WITH ended AS (
    DELETE FROM pgdrain.active_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgdrain.active_jobs
        WHERE status IN ('done', 'failed', 'cancelled')
        LIMIT %(limit)s
    ))
      AND status IN ('done', 'failed', 'cancelled')
    RETURNING *
), moved AS (
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    SELECT id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
           recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
           coalesce(finished_at, updated_at), completed_token, errors,
           sequence, depends_on, has_dependents, output, progress
    FROM ended
    RETURNING 1
)
SELECT count(*) AS moved FROM moved;

-- name: kick_debounce :many
-- Record a kick for each queue (requested_at, always) and invoke for each queue that needs a
-- run now, whose last invoke is older than the window (kicked_at) and that no live run drains
-- (run_until); `invoke` says which.
-- Concurrent callers serialise on the row, so one wins per window. A suppressed kick is not
-- lost: a run about to exit sees its requested_at (run_exit) and drains again, and a run
-- that exits clears kicked_at (run_exit too), so the next kick invokes.
-- A queue with nothing ready needs no run now, nor one whose rate window is used up. When its
-- next job may start before any wake-up pending for it (wake-ups are rounded up to
-- %(precision_seconds)s) and no live run drains it, `later_at` says when: the kick asks for a
-- wake-up then, without a run now that would only find nothing (and keep a sleeping database
-- awake).
WITH pending AS (
    SELECT q.name,
           -- A wake-up of any set of queues that holds this one starts a run that drains it
           -- ('*': a run of every queue).
           (SELECT min(w.wake_at) FROM pgdrain.wakes AS w
            WHERE (q.name = ANY(string_to_array(w.queue_set, ',')) OR w.queue_set = '*')
              AND w.state = 'created' AND w.wake_at > now()) AS wake_at,
           (SELECT min(j.run_at) FROM pgdrain.active_jobs AS j
            WHERE j.status = 'queued' AND j.queue = q.name) AS next_at,
           EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l
                   WHERE l.queue = q.name AND l.paused_at IS NOT NULL) AS paused,
           -- When the queue's rate window, used up, lets the next job start (NULL: it does now).
           (SELECT l.window_start + make_interval(secs => l.rate_seconds)
            FROM pgdrain.queue_limits AS l
            WHERE l.queue = q.name AND l.window_started >= l.rate_limit
              AND l.window_start >= pgdrain.rate_window(l.rate_seconds)) AS rate_open_at
    FROM unnest(%(queues)s::text[]) AS q(name)
), due AS (
    -- When the queue's next job may start: its run_at, or later the rate's next window. A
    -- paused queue's never (NULL): its kick is recorded (requested_at), and resuming kicks it.
    SELECT p.*, CASE WHEN NOT p.paused THEN greatest(p.next_at, p.rate_open_at) END AS due_at
    FROM pending AS p
), wanted AS (
    SELECT p.name,
           -- Due now, or nothing queued and no wake-up pending (a run now finds what there is).
           NOT p.paused AND (p.due_at <= now() OR (p.next_at IS NULL AND p.wake_at IS NULL))
               AS needed,
           CASE WHEN p.next_at IS NOT NULL AND p.due_at > now()
                 AND (p.wake_at IS NULL
                      OR p.due_at <= p.wake_at - make_interval(secs => %(precision_seconds)s::float8))
                THEN p.due_at END AS later_at
    FROM due AS p
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
               THEN (SELECT w.later_at FROM wanted AS w WHERE w.name = k.queue) END AS later_at,
          (SELECT p.paused FROM pending AS p WHERE p.name = k.queue) AS paused;

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
-- Ready jobs in these queues (NULL: every queue, found as the claim finds them) and the age of
-- the oldest: the backlog a run leaves behind (the QueueDepth and OldestReadyAgeSeconds
-- metrics). Exact, so its cost grows with the ready rows (never the finished ones): per queue,
-- an index-only scan of jobs_queued_run_at_idx from its floor's ready_from (migration 0026) to
-- now(), delayed rows not visited.
SELECT coalesce(sum(d.ready), 0)::bigint AS ready,
       coalesce(extract(epoch FROM now() - min(d.oldest)), 0)::float8 AS oldest_ready_age_s
FROM pgdrain.queue_floors AS f  -- a queue without a floor has nothing queued
CROSS JOIN LATERAL (
    SELECT count(*) AS ready, min(j.run_at) AS oldest
    FROM pgdrain.active_jobs AS j
    WHERE j.status = 'queued' AND j.queue = f.queue
      AND j.run_at >= f.ready_from AND j.run_at <= now()
) AS d
WHERE %(queues)s::text[] IS NULL OR f.queue = ANY(%(queues)s::text[]);

-- name: queue_depth_held :one
-- The ready jobs of those of these queues (NULL: every queue) that no run may claim now, at
-- their concurrency limit, out of starts in their rate window, or paused, and the age of the
-- oldest: the backlog a run leaves when it found nothing it may claim (QueueDepth and
-- OldestReadyAgeSeconds, which read 0 while such a queue's jobs waited, so no alarm fired: a
-- pause forgotten is a backlog too).
-- With no limit full and no queue paused, one probe of pgdrain.queue_limits: no job is read.
SELECT coalesce(sum(d.ready), 0)::bigint AS ready,
       coalesce(extract(epoch FROM now() - min(d.oldest)), 0)::float8 AS oldest_ready_age_s
FROM pgdrain.queue_limits AS l
JOIN pgdrain.queue_floors AS f ON f.queue = l.queue  -- from the floor, as queue_depth
CROSS JOIN LATERAL (
    SELECT count(*) AS ready, min(j.run_at) AS oldest
    FROM pgdrain.active_jobs AS j
    WHERE j.status = 'queued' AND j.queue = l.queue
      AND j.run_at >= f.ready_from AND j.run_at <= now()
) AS d
WHERE (%(queues)s::text[] IS NULL OR l.queue = ANY(%(queues)s::text[]))
  AND (l.running >= l.max_running OR l.paused_at IS NOT NULL
       OR (l.window_started >= l.rate_limit
           AND l.window_start >= pgdrain.rate_window(l.rate_seconds)));

-- name: queue_ready_count :one
-- Ready jobs in these queues (NULL: every queue) that runs may claim now, counted up to
-- %(limit)s (the fan-out decision only needs to know whether the backlog exceeds what the runs
-- can finish). A paused queue's jobs are not counted, and a rate-limited queue's no more than
-- the starts its window has left: no run may claim the rest before the next window, and runs
-- started for them would claim nothing. Per queue, each count a range of
-- jobs_queued_run_at_idx stopped at its bound.
SELECT least(coalesce(sum(counted.n), 0), %(limit)s::int)::bigint AS ready
FROM unnest(coalesce(%(queues)s::text[],
                     ARRAY(SELECT f.queue FROM pgdrain.queue_floors AS f ORDER BY f.queue))) AS q(name)
-- Without a floor (NULL), nothing is queued; probed per queue, as queue_has_ready.
CROSS JOIN LATERAL (
    SELECT min(m.ready_from) AS ready_from FROM pgdrain.queue_floor_marks AS m
    WHERE m.queue = q.name
) AS f
LEFT JOIN pgdrain.queue_limits AS l ON l.queue = q.name
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM pgdrain.active_jobs
        WHERE status = 'queued' AND queue = q.name
          AND run_at >= f.ready_from AND run_at <= now()
        LIMIT greatest(0, least(%(limit)s::int, CASE
            WHEN l.rate_limit IS NULL THEN %(limit)s::int
            WHEN l.window_start >= pgdrain.rate_window(l.rate_seconds)
                THEN l.rate_limit - l.window_started
            ELSE l.rate_limit END))
    ) AS bounded
) AS counted
WHERE l.paused_at IS NULL;

-- name: queue_ready_elsewhere :many
-- The queues outside %(queues)s with jobs ready, and how many (counted up to %(limit)s each):
-- what a run restricted to %(queues)s leaves unserved, for its summary to say. The queues are
-- found as the claim finds every queue; one bounded count per queue, from its floor.
SELECT q.name AS queue, ready.n AS ready
FROM unnest(ARRAY(SELECT f.queue FROM pgdrain.queue_floors AS f ORDER BY f.queue)) AS q(name)
-- Probed per queue, as queue_has_ready (a red team measured this join with the view at 42 s
-- for 20,000 queues: a loop over the view for each).
CROSS JOIN LATERAL (
    SELECT min(m.ready_from) AS ready_from FROM pgdrain.queue_floor_marks AS m
    WHERE m.queue = q.name
) AS f
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM pgdrain.active_jobs AS j
        WHERE j.status = 'queued' AND j.queue = q.name
          AND j.run_at >= f.ready_from AND j.run_at <= now()
        LIMIT %(limit)s::int
    ) AS bounded
) AS ready
WHERE q.name <> ALL(%(queues)s::text[]) AND ready.n > 0
ORDER BY q.name;

-- name: run_register :exec
-- A run announces itself once connected, under an id of its own invocation (a fan-out run
-- once run_admit has taken up its reservation), and holds its queues' kicks for
-- %(hold_seconds)s (run_until; never past its deadline): kicks do not invoke more runs while
-- it drains. Repeating it changes nothing but the deadline and the hold: safe to retry.
-- A run announces itself once connected (a spawned run replaces the reservation its spawner
-- made under the same id), and holds its queues' kicks for %(hold_seconds)s (run_until; never
-- past its deadline): kicks do not invoke more runs while it drains. A run of every queue
-- (%(queues)s NULL, recorded as {*}) holds the kicks of every queue kicked before; a queue
-- kicked for the first time gets a run of its own (at worst one that finds nothing). Repeating
-- it changes nothing but the deadline and the hold: safe to retry.
WITH registered AS (
    INSERT INTO pgdrain.runs (run_id, queues, chain, deadline)
    VALUES (%(run_id)s::text, coalesce(%(queues)s::text[], '{*}'), %(chain)s::int,
            now() + make_interval(secs => %(remaining_seconds)s::float8))
    ON CONFLICT (run_id) DO UPDATE
    SET queues = excluded.queues, chain = excluded.chain, deadline = excluded.deadline
    RETURNING deadline
)
INSERT INTO pgdrain.kicks AS k (queue, kicked_at, run_until)
SELECT q.name, '-infinity',
       least((SELECT deadline FROM registered),
             now() + make_interval(secs => %(hold_seconds)s::float8))
FROM unnest(coalesce(%(queues)s::text[], ARRAY(SELECT queue FROM pgdrain.kicks))) AS q(name)
ORDER BY q.name  -- every statement locks kick rows in queue order: no deadlock between them
ON CONFLICT (queue) DO UPDATE
SET run_until = greatest(k.run_until, excluded.run_until);

-- name: kick_hold :exec
-- A live run renews its hold on its queues' kicks (NULL: every queue's) (run_register): until
-- now + %(hold_seconds)s, which the caller keeps within its deadline. Safe to repeat: it only
-- moves run_until later.
UPDATE pgdrain.kicks AS k
SET run_until = greatest(k.run_until, now() + make_interval(secs => %(hold_seconds)s::float8))
WHERE k.queue IN (
    SELECT queue FROM pgdrain.kicks
    WHERE (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
    ORDER BY queue
    FOR UPDATE  -- in queue order, as every statement that locks kick rows
);

-- name: run_gate_lock :exec
-- Serialise fan-out decisions until the transaction ends. Taken in a statement of its own, so
-- that the count that follows reads a snapshot taken after the lock was granted.
SELECT id FROM pgdrain.run_gate FOR UPDATE;

-- name: run_spawn :many
-- Reserve new runs until the live runs (deadline not passed) number %(runs_needed)s, and never
-- more than %(max_runs)s; returns the ids reserved, %(spawn_id)s:1, :2... Each reservation lasts
-- %(reserve_seconds)s, until the spawned run registers with its own deadline; a spawn that never
-- starts stops counting then. Run after run_gate_lock in the same transaction. Safe to repeat
-- (a reply lost after the commit): the spawn's id, chosen by the caller, finds the reservations
-- it made, returned again instead of counted against the cap and reserved for nobody.
WITH made AS (
    SELECT run_id FROM pgdrain.runs WHERE starts_with(run_id, %(spawn_id)s::text || ':')
), reserved AS (
    INSERT INTO pgdrain.runs (run_id, queues, chain, deadline)
    SELECT %(spawn_id)s::text || ':' || n, coalesce(%(queues)s::text[], '{*}'), %(chain)s::int,
           now() + make_interval(secs => %(reserve_seconds)s::float8)
    FROM generate_series(
        1,
        least(%(runs_needed)s::int, %(max_runs)s::int)
            - (SELECT count(*) FROM pgdrain.runs WHERE deadline > now())::int
    ) AS n
    WHERE NOT EXISTS (SELECT 1 FROM made)
    RETURNING run_id
)
SELECT run_id FROM made
UNION ALL
SELECT run_id FROM reserved;

-- name: run_admit :one
-- Whether a fan-out run may drain: it takes up the place its spawner reserved for it
-- (%(reserved)s) once, deleting the reservation as it registers under an id of its own
-- (%(run_id)s, run_register next, in the same transaction). A copy of the same event (async
-- delivery is at least once), or a run that starts after its reservation lapsed or was taken,
-- is admitted only while fewer than %(max_runs)s runs are live, like a new spawn.
-- Run after run_gate_lock in the same transaction. Safe to repeat: a run already registered
-- under its own id is admitted again and takes nothing more.
WITH registered AS (
    SELECT 1 FROM pgdrain.runs WHERE run_id = %(run_id)s
), taken AS (
    DELETE FROM pgdrain.runs
    WHERE run_id = %(reserved)s AND deadline > now()
      AND NOT EXISTS (SELECT 1 FROM registered)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM registered)
       OR EXISTS (SELECT 1 FROM taken)
       OR (SELECT count(*) FROM pgdrain.runs WHERE deadline > now()) < %(max_runs)s::int
       AS admitted;

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
-- A run of every queue (%(queues)s NULL) locks every kick row, and finds the queues to look
-- in as the claim finds them.
-- Exiting with %(record)s, the run leaves its line in pgdrain.run_history (migration 0019):
-- its trigger, queues, start (%(elapsed_s)s before now, as the run measured it), counts, stop
-- reason and whether it kept its done jobs (migration 0027), in this statement, so the history
-- costs no round trip of its own.
-- Safe to repeat: the check only reads, and the exit clears and deletes what is already
-- cleared or gone, and writes no second history line (ON CONFLICT on the run's id: the
-- statement sent again after a lost reply finds the line the first one wrote).
WITH kick AS MATERIALIZED (
    SELECT requested_at FROM pgdrain.kicks
    WHERE (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
    ORDER BY queue
    FOR UPDATE
), served AS MATERIALIZED (
    SELECT coalesce(%(queues)s::text[],
                    ARRAY(SELECT f.queue FROM pgdrain.queue_floors AS f ORDER BY f.queue)) AS names
), floors AS MATERIALIZED (
    -- Where each served queue's queued jobs start (migration 0026): no queued job has a run_at
    -- before ready_from; a queue without a floor has none.
    SELECT f.queue, f.ready_from FROM pgdrain.queue_floors AS f
    WHERE f.queue = ANY((SELECT names FROM served)::text[])
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
        -- slots claim its next jobs as they finish. Nor has a paused queue, or one whose rate
        -- window is used up (due_at wakes the function when the next window opens).
        -- One probe per queue along jobs_queued_run_at_idx, as queue_has_ready: as
        -- `queue = ANY(...)` over the table, the planner expected a ready row early in a
        -- sequential scan, which reads the whole history first.
        EXISTS (
            SELECT 1
            FROM floors AS q
            CROSS JOIN LATERAL (
                SELECT 1 FROM pgdrain.active_jobs AS j
                WHERE j.status = 'queued' AND j.queue = q.queue
                  AND j.run_at >= q.ready_from AND j.run_at <= now()
                ORDER BY j.run_at
                LIMIT 1
                FOR UPDATE OF j SKIP LOCKED
            ) AS one
            WHERE NOT EXISTS (
                SELECT 1 FROM pgdrain.queue_limits AS l
                WHERE l.queue = q.queue
                  AND (l.running >= l.max_running OR l.paused_at IS NOT NULL
                       OR (l.window_started >= l.rate_limit
                           AND l.window_start >= pgdrain.rate_window(l.rate_seconds)))
            )
        ) AS ready,
        least(
            -- The earliest delayed job, one probe per queue (over all queues at once, the
            -- minimum reads every delayed row); a paused queue's wait for its resume.
            (SELECT min(next.run_at)
             FROM floors AS q
             CROSS JOIN LATERAL (
                 SELECT j.run_at FROM pgdrain.active_jobs AS j
                 WHERE j.status = 'queued' AND j.queue = q.queue
                   AND j.run_at >= q.ready_from AND j.run_at > now()
                   AND NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l
                                   WHERE l.queue = q.queue AND l.paused_at IS NOT NULL)
                 ORDER BY j.run_at
                 LIMIT 1
             ) AS next),
            -- The next window of each rate-limited queue whose window is used up while a job
            -- of it is ready: the moment its next job may start.
            (SELECT min(l.window_start + make_interval(secs => l.rate_seconds))
             FROM pgdrain.queue_limits AS l
             JOIN floors AS q ON q.queue = l.queue
             WHERE l.paused_at IS NULL
               AND l.window_started >= l.rate_limit
               AND l.window_start >= pgdrain.rate_window(l.rate_seconds)
               AND EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                           WHERE j.status = 'queued' AND j.queue = l.queue
                             AND j.run_at >= q.ready_from AND j.run_at <= now())),
            (SELECT min(lease_expires_at) FROM pgdrain.active_jobs
             WHERE status = 'running'
               -- from the floor, as the reclaim (migration 0024)
               AND lease_expires_at >= coalesce((SELECT f.at FROM pgdrain.lease_floor AS f),
                                                '-infinity')
               AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))),
            -- A job cancelled while it ran holds its slot of its queue's limit until its lease
            -- ends (migration 0040): then a run's recount gives the slot back.
            (SELECT min(f.cancelled_lease_expires_at) FROM pgdrain.finished_jobs AS f
             WHERE f.status = 'cancelled' AND f.cancelled_lease_expires_at > now()
               AND (%(queues)s::text[] IS NULL OR f.queue = ANY(%(queues)s::text[]))
               AND EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l
                           WHERE l.queue = f.queue AND l.max_running IS NOT NULL))
        ) AS due_at
), decided AS MATERIALIZED (
    SELECT NOT %(may_stay)s::boolean
           OR (NOT (s.kicked OR s.ready)
               AND (s.kick_age_s IS NULL OR s.kick_age_s >= %(linger_window_s)s::float8)) AS exits
    FROM seen AS s
), cleared AS (
    UPDATE pgdrain.kicks SET kicked_at = '-infinity', run_until = NULL
    WHERE (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND %(clear_kicks)s::boolean AND (SELECT exits FROM decided)
), unregistered AS (
    DELETE FROM pgdrain.runs
    WHERE (run_id = %(run_id)s OR deadline < now() - interval '1 hour')
      AND (SELECT exits FROM decided)
), recorded AS (
    INSERT INTO pgdrain.run_history (
        run_id, "trigger", queues, chain, started_at, finished_at, stop_reason,
        claimed, done, retried, failed, cancelled, lease_lost, reclaimed, released,
        drained_again, lingered, continued, done_kept)
    SELECT %(run_id)s::text, %(trigger)s::text, coalesce(%(queues)s::text[], '{*}'),
           %(chain)s::int, now() - make_interval(secs => %(elapsed_s)s::float8), now(),
           %(stop_reason)s::text, %(claimed)s::int, %(done)s::int, %(retried)s::int,
           %(failed)s::int, %(cancelled)s::int, %(lease_lost)s::int, %(reclaimed)s::int,
           %(released)s::int,
           %(drained_again)s::int, %(lingered)s::int, %(continued)s::boolean,
           %(done_kept)s::boolean
    WHERE %(record)s::boolean AND (SELECT exits FROM decided)
    ON CONFLICT (run_id) DO NOTHING  -- the exit repeated: the first line stands
)
SELECT s.kicked, s.kick_age_s, s.ready, s.due_at, d.exits,
       CASE WHEN isfinite(s.due_at) THEN extract(epoch FROM s.due_at - now())::float8 END
           AS due_in_s
FROM seen AS s, decided AS d;

-- name: wake_reserve :one
-- Claim the right to create the one-shot schedule for %(wake_at)s, unless an earlier or equal
-- wake-up of the same queues is pending (created, or being created and reserved_until not
-- passed). The same run may reserve again (a retried statement). Returns a row when the
-- caller must create the schedule, with the wake-up it replaced (its columns NULL when none),
-- which wake_release puts back if the schedule cannot be made.
WITH replaced AS (  -- as the statement's snapshot saw it (wake_release checks it is still ours)
    SELECT r.wake_at, r.state, r.reserved_by, r.reserved_until
    FROM pgdrain.wakes AS r
    WHERE r.queue_set = %(queue_set)s::text AND r.reserved_by <> %(run_id)s::text
)
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
RETURNING w.wake_at,
          (SELECT r.wake_at FROM replaced AS r) AS replaced_wake_at,
          (SELECT r.state FROM replaced AS r) AS replaced_state,
          (SELECT r.reserved_by FROM replaced AS r) AS replaced_reserved_by,
          (SELECT r.reserved_until FROM replaced AS r) AS replaced_reserved_until;

-- name: wake_confirm :one
-- A wake-up request ({"reason": "later"}) takes up the wake-up its kick reserved: only one the
-- database holds under the kick's own id, due after now and within %(horizon_seconds)s, becomes
-- created (pending until its time). Until then the reservation holds for WAKE_HOLD_SECONDS
-- only, so a request that never gets here (the function could not reach the database, the
-- application died before it invoked) suppresses no later kick's or run's wake-up for longer.
-- Past that hold the request still takes it up while no one else has. Safe to repeat (a
-- retried event): a created row of the same kick is confirmed again.
UPDATE pgdrain.wakes SET state = 'created'
WHERE queue_set = %(queue_set)s AND wake_at = %(wake_at)s AND reserved_by = %(run_id)s
  AND state IN ('creating', 'created')
  AND wake_at > now()
  AND wake_at <= now() + make_interval(secs => %(horizon_seconds)s::float8)
RETURNING true;

-- name: wake_created :exec
-- The schedule exists: the reservation becomes a pending wake-up until its time.
UPDATE pgdrain.wakes SET state = 'created'
WHERE queue_set = %(queue_set)s AND wake_at = %(wake_at)s AND reserved_by = %(run_id)s;

-- name: wake_release :exec
-- Creating the schedule failed: drop the reservation, so the next run that ends tries again.
-- (Whatever its state: a wake-up request confirms its kick's reservation before it creates the
-- schedule, and drops it if it cannot.) A reservation that replaced another wake-up (a later
-- one: its schedule made, or its kick's request on its way) puts that one back instead of
-- leaving none: the replaced wake-up still runs, or its request is still taken up. Only while
-- the row is still this caller's: safe to repeat.
WITH restored AS (
    UPDATE pgdrain.wakes
    SET wake_at = %(replaced_wake_at)s::timestamptz, state = %(replaced_state)s::text,
        reserved_by = %(replaced_reserved_by)s::text,
        reserved_until = %(replaced_reserved_until)s::timestamptz
    WHERE queue_set = %(queue_set)s AND wake_at = %(wake_at)s AND reserved_by = %(run_id)s
      AND %(replaced_wake_at)s::timestamptz IS NOT NULL
    RETURNING 1
)
DELETE FROM pgdrain.wakes
WHERE queue_set = %(queue_set)s AND wake_at = %(wake_at)s AND reserved_by = %(run_id)s
  AND %(replaced_wake_at)s::timestamptz IS NULL;

-- name: queue_limit_sync :exec
-- Make pgdrain.queue_limits say what PGDRAIN_QUEUE_LIMITS says for these queues (NULL: every
-- queue): add or change the limits given (concurrency, rate: either NULL), drop the others
-- (a paused queue keeps its row and its pause). A new limit starts from an exact count of the queue's
-- running jobs, taken under a lock that no claim or completion passes (the function, migration
-- 0012, says how); %(wait_ms)s bounds the wait for it. Safe to repeat: it writes the same
-- values again.
-- With every queue (NULL), the queues it manages are those with a limit now.
SELECT pgdrain.queue_limits_sync(
    coalesce(%(queues)s::text[], ARRAY(SELECT l.queue FROM pgdrain.queue_limits AS l)),
    %(limited)s::text[], %(limits)s::int[], %(rates)s::int[], %(periods)s::int[],
    %(wait_ms)s::int);

-- name: queue_limit_recount :many
-- A limit's self-correction: the running count of each of these queues whose limit row says it
-- is full while a job of it is ready is recounted, exactly (pgdrain.queue_limits_recount,
-- migration 0012), and corrected. Returns the rows corrected (queue, the count it had, the
-- exact count): none unless a count had drifted. Sent with a run's first claim and its exit
-- check. With no limit full and nothing held back (the common case), the function is not
-- called: one probe of pgdrain.queue_limits. Safe to repeat: a count made exact stays exact.
SELECT r.queue, r.was, r.running
FROM (SELECT ARRAY(
        SELECT l.queue FROM pgdrain.queue_limits AS l
        WHERE (%(queues)s::text[] IS NULL OR l.queue = ANY(%(queues)s::text[]))
          AND l.running >= l.max_running
          AND EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                      WHERE j.status = 'queued' AND j.queue = l.queue AND j.run_at <= now())
        ORDER BY l.queue
     ) AS full_queues) AS f
CROSS JOIN LATERAL pgdrain.queue_limits_recount(f.full_queues) AS r
WHERE cardinality(f.full_queues) > 0;
