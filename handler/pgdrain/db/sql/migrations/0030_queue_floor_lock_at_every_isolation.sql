-- pgdrain 0030: an enqueue under REPEATABLE READ or SERIALIZABLE takes its queue's lock too.
--
-- queue_floor_lower (migration 0026) took the shared lock only under READ COMMITTED, and added
-- a mark unlocked otherwise, on the ground that a raise deletes only the marks it can see. It
-- can see more: queue_floors_raise reads the floor and the queue's first queued job, then
-- deletes the queue's marks in a statement of its own, whose snapshot sees a mark committed in
-- between. A job committed in that window (its row unseen by the read, its mark deleted) lay
-- below the floor, or in a queue without marks: no run claimed it again. Behind a held snapshot
-- the window is the raise's walk over dead entries (16 ms was seen). The lease floor's writers
-- (0024) lock at every isolation level already. Catalog change only.

CREATE OR REPLACE FUNCTION pgdrain.queue_floor_lower() RETURNS trigger
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
        -- Held until this transaction ends, at every isolation level: no raise of this queue
        -- runs until its rows are visible, and a raise that ran before it committed before the
        -- probe below. One of 64 locks, by the queue's hash: a transaction that enqueues into
        -- thousands of queues takes 64 at most (the server's lock table is shared, and
        -- bounded); two queues that share one only make a raise pass over both while either is
        -- written.
        PERFORM pg_advisory_xact_lock_shared(hashtext('pgdrain.queue_floor'), hashtext(low.queue) & 63);
        IF read_committed THEN
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
        -- Under REPEATABLE READ or SERIALIZABLE the snapshot predates the lock and may not see
        -- a raise since, so no mark is read: one is added. The lock still keeps a raise away
        -- until it commits: a raise's DELETE of the queue's marks reads a snapshot of its own,
        -- which would see (and take) a mark that committed after its read of the jobs.
        INSERT INTO pgdrain.queue_floor_marks (queue, priority, run_at, id, ready_from)
        VALUES (low.queue, low.priority, low.run_at, low.id, low.run_at);
    END LOOP;
    RETURN NULL;
END
$$;
