-- pgdrain 0036: many jobs enqueued in one transaction behind the same job, or into the same
-- sequence, cost each the same, not more with each one before it.
--
-- jobs_flow_enqueued (migration 0029) set has_dependents on each dependency of every job it
-- queued, and touched the sequence's row for every job of a sequence. In one transaction each
-- of those wrote a new version of the same row, which every later lookup of it walked: 20,000
-- jobs after one job took 24 times as long as 20,000 plain ones, 20,000 into one sequence 7
-- times (found by a red team; enqueue_many and workflow() enqueue in one transaction). Now a
-- dependency already marked is only locked (a row this transaction has locked is locked again
-- without a write), and the sequence's row is touched once per transaction (the upsert still
-- locks it). The lock is what matters: a dependency's move to finished_jobs waits for it, so
-- its trigger sees this job and queues it. Catalog change only.

CREATE OR REPLACE FUNCTION pgdrain.jobs_flow_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found integer;
    unfinished integer;
    ended bigint;
    ended_status text;
    missing bigint;
BEGIN
    IF NEW.status <> 'queued' THEN
        RETURN NEW;
    END IF;
    IF NEW.sequence IS NOT NULL THEN
        -- Locks the sequence's row either way; writes it once per transaction.
        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)
        ON CONFLICT (sequence) DO UPDATE SET touched_at = now()
            WHERE s.touched_at IS DISTINCT FROM now();
        IF EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                   WHERE j.sequence = NEW.sequence
                     AND j.status IN ('waiting', 'queued', 'running', 'parked')
                     AND j.id <> NEW.id) THEN
            NEW.status := 'waiting';
        END IF;
        RETURN NEW;
    END IF;
    -- The unfinished dependencies, locked and marked: their move to finished_jobs then carries
    -- has_dependents, and fires jobs_flow_finished for this job. One marked already is only
    -- locked: a new version of it for every dependent would be walked by every lookup after.
    WITH locked AS (
        SELECT d.id, d.status, d.has_dependents
        FROM pgdrain.active_jobs AS d
        WHERE d.id = ANY(NEW.depends_on)
        FOR NO KEY UPDATE
    ), marked AS (
        -- By primary key (joined with `locked`, the plan walked the whole table per job).
        UPDATE pgdrain.active_jobs AS d SET has_dependents = true
        WHERE d.id = ANY(NEW.depends_on) AND NOT d.has_dependents
    )
    SELECT count(*), count(*) FILTER (WHERE m.status <> 'done'),
           min(m.id) FILTER (WHERE m.status IN ('failed', 'cancelled'))
    INTO found, unfinished, ended
    FROM locked AS m;
    -- The others have finished (a statement of its own: a move that committed while the
    -- UPDATE waited is seen).
    IF found < (SELECT count(DISTINCT d) FROM unnest(NEW.depends_on) AS d) THEN
        SELECT count(*) + found,
               least(ended, min(f.id) FILTER (WHERE f.status IN ('failed', 'cancelled')))
        INTO found, ended
        FROM pgdrain.finished_jobs AS f
        WHERE f.id = ANY(NEW.depends_on);
    END IF;
    -- A job queued again by `pgdrain retry` (store.job_retry marks its transaction) had its
    -- dependencies judged by the retry: a dependency retention has deleted since counts as done.
    IF found < (SELECT count(DISTINCT d) FROM unnest(NEW.depends_on) AS d)
       AND current_setting('pgdrain.queued_again', true) IS DISTINCT FROM 'on' THEN
        SELECT min(d) INTO missing FROM unnest(NEW.depends_on) AS d
        WHERE NOT EXISTS (SELECT 1 FROM pgdrain.jobs AS j WHERE j.id = d);
        RAISE EXCEPTION 'pgdrain: job % (a dependency) does not exist', missing
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'jobs_depends_on_exist';
    END IF;
    IF ended IS NOT NULL THEN
        SELECT j.status INTO ended_status FROM pgdrain.jobs AS j WHERE j.id = ended;
        NEW.status := 'cancelled';
        NEW.finished_at := now();
        NEW.last_error := 'cancelled: job ' || ended || ', which it depends on, '
                          || CASE ended_status WHEN 'failed' THEN 'failed'
                                               ELSE 'was cancelled' END;
    ELSIF unfinished > 0 THEN
        NEW.status := 'waiting';
    END IF;
    RETURN NEW;
END
$$;
