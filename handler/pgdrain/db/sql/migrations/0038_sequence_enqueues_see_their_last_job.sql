-- pgdrain 0038: a job enqueued into a sequence sees the sequence as it is, not as an old
-- snapshot saw it, and waits for the lease of a last job cancelled while it ran.
--
-- Found by a red team:
-- - Enqueued from a REPEATABLE READ or SERIALIZABLE transaction whose snapshot still saw the
--   sequence's last job running (it finished since), a job was made `waiting`, and nothing
--   would ever queue it. The sequence's row is kept while it has an unfinished job, so a row
--   this enqueue has to make means those jobs finished after the snapshot: it now fails with a
--   serialization failure, which the application runs again (as an enqueue after a dependency
--   that finished since already did).
-- - Enqueued after the sequence's last job was cancelled while running, a job was queued at
--   once, beside that job's code, which runs until its lease ends. The sequence's row now keeps
--   that lease's end (lease_until), and such a job is queued for then.
-- A column and two functions: catalog changes only.

ALTER TABLE pgdrain.sequences ADD COLUMN lease_until timestamptz;

CREATE OR REPLACE FUNCTION pgdrain.jobs_flow_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found integer;
    unfinished integer;
    ended bigint;
    ended_status text;
    missing bigint;
    made boolean;
BEGIN
    IF NEW.status <> 'queued' THEN
        RETURN NEW;
    END IF;
    IF NEW.sequence IS NOT NULL THEN
        -- Locks the sequence's row either way; writes it once per transaction. Made here (not
        -- there before) when the sequence has no unfinished job: its row is kept while it has.
        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)
        ON CONFLICT (sequence) DO UPDATE SET touched_at = now()
            WHERE s.touched_at IS DISTINCT FROM now()
        RETURNING s.xmax = 0 INTO made;
        IF EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                   WHERE j.sequence = NEW.sequence
                     AND j.status IN ('waiting', 'queued', 'running', 'parked')
                     AND j.id <> NEW.id) THEN
            IF made AND current_setting('transaction_isolation') <> 'read committed' THEN
                -- The snapshot predates the finish of the jobs it sees: as waiting, this job
                -- would wait for a finish that has happened, for good.
                RAISE EXCEPTION 'pgdrain: sequence %''s last job finished after this '
                    'transaction''s snapshot was taken: run the transaction again', NEW.sequence
                    USING ERRCODE = 'serialization_failure';
            END IF;
            NEW.status := 'waiting';
        ELSE
            -- Its last job, cancelled while it ran, may run until its lease ends: this job
            -- starts after that, as a job waiting behind it would (migration 0034).
            NEW.run_at := greatest(NEW.run_at, (SELECT s.lease_until FROM pgdrain.sequences AS s
                                                WHERE s.sequence = NEW.sequence));
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

CREATE OR REPLACE FUNCTION pgdrain.jobs_flow_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    made_ready text[] := '{}';  -- the queues of the jobs made ready
    n bigint;
BEGIN
    IF NEW.sequence IS NOT NULL THEN
        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)
        ON CONFLICT (sequence) DO UPDATE SET touched_at = now();
        IF NOT EXISTS (SELECT 1 FROM pgdrain.active_jobs AS j
                       WHERE j.sequence = NEW.sequence
                         AND j.status IN ('queued', 'running', 'parked')) THEN
            WITH promoted AS (
                UPDATE pgdrain.active_jobs AS j
                -- greatest() passes over NULL: not cancelled while running.
                SET status = 'queued',
                    run_at = greatest(j.run_at, now(), NEW.cancelled_lease_expires_at),
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
            IF n = 0 AND NEW.cancelled_lease_expires_at > now() THEN
                -- Kept, with the lease's end: the next job enqueued into it waits for that.
                UPDATE pgdrain.sequences AS s SET lease_until = NEW.cancelled_lease_expires_at
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
            SET status = 'queued', run_at = greatest(d.run_at, now()), updated_at = now()
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
