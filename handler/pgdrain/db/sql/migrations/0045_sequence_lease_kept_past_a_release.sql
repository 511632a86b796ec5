-- pgdrain 0045: a job a sequence or its dependencies release, as a red team found it.
--
-- A sequence's running head cancelled releases the job behind it for the end of the head's
-- lease (0034); 0042 kept that lease on the sequence's row only when no job was released. So
-- when the released job was cancelled in turn, before the lease ended, the one behind it was
-- queued for now, and a run took it beside the head's code. The lease is now kept whenever it
-- has not ended, and read by the next finish.
--
-- A released job was queued at now() (or its own delay's end): it sorted after every job
-- enqueued into its queue meanwhile, so each step of a sequence or a workflow waited behind the
-- queue's whole backlog, and an N-step chain took N backlogs. It now keeps the run_at it was
-- enqueued with (or its delay's end, or a cancelled attempt's lease, as before): a run finds
-- it from its queue's floor, which the release marks below it, within a position's age
-- (runner/positions.py). One function replaced.

CREATE OR REPLACE FUNCTION pgdrain.jobs_flow_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    made_ready text[] := '{}';  -- the queues of the jobs made ready
    n bigint;
    held_until timestamptz;
BEGIN
    IF NEW.sequence IS NOT NULL THEN
        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)
        ON CONFLICT (sequence) DO UPDATE SET touched_at = now()
        RETURNING s.lease_until INTO held_until;
        -- The lease of a job of the sequence cancelled while it ran, this one or one before it
        -- (migration 0038): its code may run until then, so the next job waits for it.
        -- greatest() passes over NULL: none cancelled while running.
        held_until := greatest(held_until, NEW.cancelled_lease_expires_at);
        IF NOT EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                       WHERE j.sequence = NEW.sequence
                         AND j.status IN ('queued', 'running', 'parked')) THEN
            WITH promoted AS (
                UPDATE pgdrain.active_jobs AS j
                SET status = 'queued',
                    -- Its place as enqueued (or later: its delay, the lease), not now(): at
                    -- now() it sorted after every job enqueued meanwhile, and each step of a
                    -- sequence waited behind the whole backlog of its queue.
                    run_at = greatest(j.run_at, held_until),
                    updated_at = now()
                WHERE j.id = (SELECT w.id FROM pgdrain.active_jobs AS w
                              WHERE w.sequence = NEW.sequence AND w.status = 'waiting'
                              ORDER BY w.id LIMIT 1)
                RETURNING j.queue, j.run_at <= now() AS ready
            )
            SELECT count(*),
                   made_ready || coalesce(array_agg(p.queue) FILTER (WHERE p.ready), '{}')
            INTO n, made_ready
            FROM promoted AS p;
            IF held_until > now() THEN
                -- Kept, with the lease's end: the next job enqueued into it waits for that, and
                -- so does the one behind a job released now, should that one be cancelled
                -- before the lease ends.
                UPDATE pgdrain.sequences AS s SET lease_until = held_until
                WHERE s.sequence = NEW.sequence;
            ELSIF n = 0 THEN
                DELETE FROM pgdrain.sequences AS s WHERE s.sequence = NEW.sequence;
            END IF;
        END IF;
    END IF;
    IF NEW.has_dependents AND NEW.status = 'done' THEN
        -- Lock the dependents first, then look at their other dependencies in a statement
        -- of its own: a concurrent finish of another of them has then committed, or waits.
        PERFORM 1 FROM pgdrain.active_jobs AS d
        WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting'
        ORDER BY d.id
        FOR UPDATE;
        -- All dependencies done: none unfinished, none finished otherwise.
        WITH promoted AS (
            UPDATE pgdrain.active_jobs AS d
            SET status = 'queued', updated_at = now()  -- run_at as enqueued, as above
            WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting'
              AND NOT EXISTS (SELECT 1 FROM pgdrain.active_jobs AS x
                              WHERE x.id = ANY(d.depends_on))
              AND NOT EXISTS (SELECT 1 FROM pgdrain.finished_jobs AS x
                              WHERE x.id = ANY(d.depends_on) AND x.status <> 'done')
            RETURNING d.queue, d.run_at <= now() AS ready
        )
        SELECT made_ready || coalesce(array_agg(p.queue) FILTER (WHERE p.ready), '{}')
        INTO made_ready
        FROM promoted AS p;
    ELSIF NEW.has_dependents THEN
        WITH ended AS (
            DELETE FROM pgdrain.active_jobs AS d
            WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting'
            RETURNING d.*
        )
        INSERT INTO pgdrain.finished_jobs
            (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
             recovery_policy, reclaim_count, idempotency_key, last_error, created_at,
             updated_at, finished_at, completed_token, errors, sequence, depends_on,
             has_dependents, output, progress)
        SELECT d.id, d.queue, d.kind, d.payload, 'cancelled', d.priority, d.run_at, d.attempts,
               d.max_attempts, d.recovery_policy, d.reclaim_count, d.idempotency_key,
               'cancelled: job ' || NEW.id || ', which it depends on, '
               || CASE NEW.status WHEN 'failed' THEN 'failed' ELSE 'was cancelled' END,
               d.created_at, now(), now(), d.completed_token, d.errors, d.sequence,
               d.depends_on, d.has_dependents, d.output, d.progress
        FROM ended AS d;
    END IF;
    IF cardinality(made_ready) > 0 THEN  -- DETAIL: their queues (a name holds no comma)
        RAISE NOTICE 'pgdrain: jobs made ready'
            USING DETAIL = array_to_string(ARRAY(SELECT DISTINCT q FROM unnest(made_ready) AS q
                                                 ORDER BY q), ',');
    END IF;
    RETURN NULL;
END
$$;
-- CREATE OR REPLACE sets the function's settings anew: the NOTICE still reaches the run.
ALTER FUNCTION pgdrain.jobs_flow_finished() SET client_min_messages = 'notice';
