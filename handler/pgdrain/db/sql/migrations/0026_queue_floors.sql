-- pgdrain 0026: a run finds each queue's queued jobs from a floor no queued job sorts before, not
-- from the queue's first index entry (docs/decisions/0017, the queue half of option 4). Behind a
-- snapshot held open elsewhere every job claimed since keeps a dead entry in jobs_ready_idx and
-- jobs_queued_run_at_idx that no vacuum and no scan can remove, and a fresh run's first claim,
-- its last ones and its exit check walked all of them.
--
-- The protocol, as the lease floor's (0024), per queue: a statement that writes a queued row
-- takes a shared transaction-level advisory lock on its queue, then makes sure a mark at or
-- below its rows is there; only a transaction holding the queue's lock exclusively raises the
-- floor, to the first queued job as a snapshot taken after the lock sees them. Writers add marks
-- and never update one, so two enqueues never wait for each other (not even the first two into
-- an empty queue); nothing is added to a job's row or indexes, and the lock writes no WAL.

-- Each row is a mark: no queued job of its queue sorts before (priority, run_at, id), and none
-- has a run_at before ready_from. A queue's floor is the least of its marks; a queue without a
-- mark has no queued job.
CREATE TABLE pgdrain.queue_floor_marks (
    queue      text        NOT NULL,
    priority   int         NOT NULL,
    run_at     timestamptz NOT NULL,
    id         bigint      NOT NULL,
    ready_from timestamptz NOT NULL
);
CREATE INDEX queue_floor_marks_idx ON pgdrain.queue_floor_marks (queue, priority, run_at, id);

-- Each queue that has a mark and its floor: the least key of its marks, the least ready_from.
-- What the claim, the exit check and the control plane read in place of walking the queues.
CREATE VIEW pgdrain.queue_floors AS
SELECT DISTINCT ON (m.queue)
       m.queue, m.priority, m.run_at, m.id,
       min(m.ready_from) OVER (PARTITION BY m.queue) AS ready_from,
       count(*) OVER (PARTITION BY m.queue) AS marks
FROM pgdrain.queue_floor_marks AS m
ORDER BY m.queue, m.priority, m.run_at, m.id;

-- Make sure each queue the statement wrote a queued row to has a mark at or below its rows.
-- SECURITY DEFINER: the application's enqueuer role and the dashboard's actions need no grant.
CREATE FUNCTION pgdrain.queue_floor_lower() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    low record;
    read_committed boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    -- Per queue, the least priority, run_at and id of its new queued rows: a key at or before
    -- each of them (a hash aggregate; no sort of the statement's rows).
    FOR low IN
        SELECT n.queue, min(n.priority) AS priority, min(n.run_at) AS run_at, min(n.id) AS id
        FROM new_rows AS n
        WHERE n.status = 'queued'
        GROUP BY n.queue
    LOOP
        IF read_committed THEN
            -- Held until this transaction ends: no raise of this queue runs until its rows are
            -- visible, and a raise that ran before it committed before the probe below. One of
            -- 64 locks, by the queue's hash: a transaction that enqueues into thousands of
            -- queues takes 64 at most (the server's lock table is shared, and bounded); two
            -- queues that share one only make a raise pass over both while either is written.
            PERFORM pg_advisory_xact_lock_shared(hashtext('pgdrain.queue_floor'), hashtext(low.queue) & 63);
            -- A statement of its own, so its snapshot is taken after the lock. The nearest mark
            -- below first: floors rise, so the marks a raise since left dead lie below it.
            PERFORM 1 FROM pgdrain.queue_floor_marks AS m
            WHERE m.queue = low.queue
              AND (m.priority, m.run_at, m.id) <= (low.priority, low.run_at, low.id)
              AND m.ready_from <= low.run_at
            ORDER BY m.priority DESC, m.run_at DESC, m.id DESC
            LIMIT 1;
            IF FOUND THEN
                CONTINUE;  -- the common case: a mark covers the rows, nothing is written
            END IF;
        END IF;
        -- Under REPEATABLE READ or SERIALIZABLE the snapshot predates any lock and may not see
        -- a raise since, so no mark is read: one is added. It needs no lock either: a raise
        -- deletes only the marks it can see, never one not yet committed.
        INSERT INTO pgdrain.queue_floor_marks (queue, priority, run_at, id, ready_from)
        VALUES (low.queue, low.priority, low.run_at, low.id, low.run_at);
    END LOOP;
    RETURN NULL;
END
$$;

-- Every enqueue, and every update (a retry, a release, a reclaim, a sequence's or dependency's
-- release, an operator's retry, a row changed by hand). Transition tables allow one event per
-- trigger; on UPDATE the table is the one jobs_queue_limits_count builds already.
CREATE TRIGGER jobs_queue_floor_insert
    AFTER INSERT ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.queue_floor_lower();
CREATE TRIGGER jobs_queue_floor_update
    AFTER UPDATE ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.queue_floor_lower();
-- Fired whatever the session's session_replication_role (a copy of data made in `replica` mode
-- fires no ordinary trigger): a row queued without its mark is hidden from every claim, and an
-- extra mark costs nothing but a lower floor. The lease floor's triggers (0024) likewise: a
-- lease written without lowering it is never reclaimed.
ALTER TABLE pgdrain.active_jobs
    ENABLE ALWAYS TRIGGER jobs_queue_floor_insert,
    ENABLE ALWAYS TRIGGER jobs_queue_floor_update,
    ENABLE ALWAYS TRIGGER jobs_lease_floor_insert,
    ENABLE ALWAYS TRIGGER jobs_lease_floor_update;

-- Raise each queue's floor to its first queued job, walking from the floor: only the entries of
-- the jobs claimed since the last raise. A queue with nothing queued loses its marks. It only
-- tries each queue's lock: a raise waiting for one would queue that queue's writers behind it,
-- and while one of them is in flight that floor stays where it is, still below every queued
-- job. Sent as a transaction of its own (runner/reclaim.py): holding the locks, it waits for
-- nothing else. Safe to repeat: it computes each floor again from the jobs as they are.
CREATE FUNCTION pgdrain.queue_floors_raise() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    name text;
    floor record;
    first record;
    ready timestamptz;
BEGIN
    -- Only READ COMMITTED takes the snapshots of the reads below after the lock.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    -- At most 100 queues per raise, taken at random, so that a raise stays short however many
    -- queues there are (a queue per tenant): a floor not raised this time is still a floor.
    FOR name IN
        SELECT q.queue FROM (SELECT DISTINCT m.queue FROM pgdrain.queue_floor_marks AS m) AS q
        ORDER BY random()
        LIMIT 100
    LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('pgdrain.queue_floor'), hashtext(name) & 63);
        -- Each statement from here takes its snapshot after the lock: every mark and every
        -- queued row of the queue committed before it, and none can commit until this ends.
        SELECT f.priority, f.run_at, f.id, f.ready_from, f.marks INTO floor
        FROM pgdrain.queue_floors AS f WHERE f.queue = name;
        CONTINUE WHEN NOT FOUND;
        -- A plain read: a row a claim has locked is still queued until that claim commits.
        SELECT j.priority, j.run_at, j.id INTO first
        FROM pgdrain.active_jobs AS j
        WHERE j.status = 'queued' AND j.queue = name
          AND (j.priority, j.run_at, j.id) >= (floor.priority, floor.run_at, floor.id)
        ORDER BY j.priority, j.run_at, j.id
        LIMIT 1;
        IF NOT FOUND THEN
            DELETE FROM pgdrain.queue_floor_marks AS m WHERE m.queue = name;
            CONTINUE;
        END IF;
        SELECT j.run_at INTO ready
        FROM pgdrain.active_jobs AS j
        WHERE j.status = 'queued' AND j.queue = name AND j.run_at >= floor.ready_from
        ORDER BY j.run_at
        LIMIT 1;
        -- A claim that committed between the two reads may have taken the last job: keep it.
        ready := coalesce(ready, floor.ready_from);
        -- Written only when it moves: behind a held snapshot each version stays, and every read
        -- of the floors passes it.
        CONTINUE WHEN floor.marks = 1
            AND (first.priority, first.run_at, first.id, ready)
                = (floor.priority, floor.run_at, floor.id, floor.ready_from);
        DELETE FROM pgdrain.queue_floor_marks AS m WHERE m.queue = name;
        INSERT INTO pgdrain.queue_floor_marks (queue, priority, run_at, id, ready_from)
        VALUES (name, first.priority, first.run_at, first.id, ready);
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION pgdrain.queue_floors_raise() FROM PUBLIC;

-- The queues that hold queued jobs now, each at its least key: the triggers above already hold
-- the table (no writer is in flight without them), so no row is missed.
INSERT INTO pgdrain.queue_floor_marks (queue, priority, run_at, id, ready_from)
SELECT j.queue, min(j.priority), min(j.run_at), min(j.id), min(j.run_at)
FROM pgdrain.active_jobs AS j
WHERE j.status = 'queued'
GROUP BY j.queue;

-- The claim, a run's exit and the control plane read the floors, and a run raises them: a
-- worker role granted before this migration would fail every claim until worker_role.sql is run
-- again, so the grants are made here too.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_worker') THEN
        GRANT SELECT ON pgdrain.queue_floors TO pgdrain_worker;
        GRANT EXECUTE ON FUNCTION pgdrain.queue_floors_raise() TO pgdrain_worker;
    END IF;
END
$$;
