-- pgdrain 0006: the control plane's state, so that PostgreSQL is its only coordinator.

-- Trailing-edge kicks: when a kick was last asked for, beside when one last invoked. A run
-- that is about to exit compares requested_at with its own clock (pgdrain.aws.control).
ALTER TABLE pgdrain.kicks ADD COLUMN requested_at timestamptz NOT NULL DEFAULT '-infinity';

-- Pending wake-ups: one row per set of queues, the earliest one-shot schedule known to exist
-- (state 'created') or being created by a run (state 'creating', which holds only until
-- reserved_until: a run killed between reserving and creating suppresses nothing for long).
CREATE TABLE pgdrain.wakes (
    queue_set      text        PRIMARY KEY,  -- the queues, sorted and comma-joined
    wake_at        timestamptz NOT NULL,
    state          text        NOT NULL,
    reserved_by    text        NOT NULL,
    reserved_until timestamptz NOT NULL,
    CONSTRAINT wakes_state_chk CHECK (state IN ('creating', 'created'))
);

-- Runs alive now: registered when a run connects (or reserved by the run that spawns it),
-- deleted when it exits. A row past its deadline counts for nothing (its run was killed).
CREATE TABLE pgdrain.runs (
    run_id     text        PRIMARY KEY,
    queues     text[]      NOT NULL,
    chain      integer     NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    deadline   timestamptz NOT NULL
);

-- One row whose lock serialises fan-out decisions, so the PGDRAIN_MAX_RUNS cap holds.
CREATE TABLE pgdrain.run_gate (
    id boolean PRIMARY KEY DEFAULT true,
    CONSTRAINT run_gate_one_row_chk CHECK (id)
);
INSERT INTO pgdrain.run_gate DEFAULT VALUES;

-- Per-queue concurrency limits that hold across all concurrent runs (PGDRAIN_QUEUE_LIMITS,
-- written by runs). `running` counts the queue's running jobs and is kept by the trigger
-- below, so that a claim reads it through the row lock it takes: a count(*) of jobs would read
-- the snapshot its statement took before the lock was granted, and two concurrent claims
-- would both see the old count.
CREATE TABLE pgdrain.queue_limits (
    queue       text    PRIMARY KEY,
    max_running integer NOT NULL,
    running     integer NOT NULL DEFAULT 0,
    CONSTRAINT queue_limits_max_chk CHECK (max_running >= 1),
    CONSTRAINT queue_limits_running_chk CHECK (running >= 0)
);

-- Once per statement, from its transition tables: the claim (and every statement that ends
-- an attempt: complete, fail, release, reclaim) moves the counters of limited queues.
CREATE FUNCTION pgdrain.queue_limits_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
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

CREATE TRIGGER jobs_queue_limits_count
    AFTER UPDATE ON pgdrain.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.queue_limits_count();
