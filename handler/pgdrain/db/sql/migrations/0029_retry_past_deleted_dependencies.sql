-- pgdrain 0029: `pgdrain retry` of a job with dependencies, once retention has deleted one.
--
-- A failed job ran, so every job it depends on was done: queued again, it runs, whether or not
-- those jobs are still kept. Before, its re-insert raised "job N (a dependency) does not exist"
-- (jobs_flow_enqueued, migration 0021), which failed the whole retry, every other job named or
-- matched with it. The retry statement (job_retry, operator_commands.sql) now judges each job's
-- dependencies itself, and marks its transaction (pgdrain.queued_again): a dependency missing
-- from both tables then counts as done here. An enqueue is judged as before. Catalog change only.

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
        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)
        ON CONFLICT (sequence) DO UPDATE SET touched_at = now();
        IF EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                   WHERE j.sequence = NEW.sequence
                     AND j.status IN ('waiting', 'queued', 'running', 'parked')
                     AND j.id <> NEW.id) THEN
            NEW.status := 'waiting';
        END IF;
        RETURN NEW;
    END IF;
    -- The unfinished dependencies, locked and marked: their move to finished_jobs then carries
    -- has_dependents, and fires jobs_flow_finished for this job.
    WITH marked AS (
        UPDATE pgdrain.active_jobs AS d SET has_dependents = true
        WHERE d.id = ANY(NEW.depends_on)
        RETURNING d.id, d.status
    )
    SELECT count(*), count(*) FILTER (WHERE m.status <> 'done'),
           min(m.id) FILTER (WHERE m.status IN ('failed', 'cancelled'))
    INTO found, unfinished, ended
    FROM marked AS m;
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
