-- pgdrain 0046: enqueues with an idempotency key, as a red team found them.
--
-- - A key held by an unfinished job, enqueued again `after=` a job that had failed or been
--   cancelled, inserted a new cancelled job (the trigger made it cancelled before the key's
--   unique index was consulted, and that index holds unfinished jobs only) and returned its id,
--   not the holder's. Enqueued again with a sequence or a dependency, a held key also wrote the
--   sequence's row and marked the dependency. Now such an enqueue inserts nothing at all.
-- - Cancelling a running job freed its key at once: a new job of the key ran beside the
--   cancelled attempt's code, which may run until its lease ends. A new job of the key now
--   starts after that lease, as a sequence's next job does.
-- The trigger now fires for a row with a key too (its WHEN), and returns at once for a row
-- with none of a key, a sequence or dependencies. One function replaced, its trigger made again.
-- Left as they were: a held key enqueued with flow through the view by hand (the trigger's
-- second level, as a retry's move is), or beside the holder's insert not yet committed.

CREATE OR REPLACE FUNCTION pgdrain.jobs_flow_enqueued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found integer;
    unfinished integer;
    ended bigint;
    ended_status text;
    missing bigint;
    made boolean;
    demoted bigint;
    holders bigint;
BEGIN
    IF NEW.status <> 'queued' THEN
        RETURN NEW;
    END IF;
    IF NEW.idempotency_key IS NOT NULL THEN
        -- An enqueue with a sequence or dependencies (not the move of a retried job, which
        -- arrives through the view's trigger) whose key an unfinished job of its queue holds
        -- inserts nothing, ON CONFLICT's answer reached first: no sequence row, no dependency
        -- marked, and no cancelled job made for a dependency that ended. The caller then finds
        -- the holder by its key. The holder is locked, not only read: a finish in progress is
        -- waited for and the key then found free (READ COMMITTED), or is a serialization
        -- failure to run again (a snapshot older than that finish), never a drop.
        IF pg_trigger_depth() = 1 AND (NEW.sequence IS NOT NULL OR NEW.depends_on IS NOT NULL) THEN
            PERFORM 1 FROM pgdrain.active_jobs AS k
            WHERE k.queue = NEW.queue AND k.idempotency_key = NEW.idempotency_key
              AND k.status IN ('queued', 'running', 'parked', 'waiting')
            FOR KEY SHARE;
            -- Not FOUND: this function's variable `found` hides it.
            GET DIAGNOSTICS holders = ROW_COUNT;
            IF holders > 0 THEN
                RETURN NULL;
            END IF;
        END IF;
        -- A job of its key cancelled while it ran may run until its lease ends: a new job of
        -- the key starts after that, as the next job of a sequence does (migration 0034).
        NEW.run_at := greatest(NEW.run_at, (
            SELECT max(f.cancelled_lease_expires_at) FROM pgdrain.finished_jobs_failed AS f
            WHERE f.cancelled_lease_expires_at > now()
              AND f.queue = NEW.queue AND f.idempotency_key = NEW.idempotency_key));
    END IF;
    IF NEW.sequence IS NULL AND NEW.depends_on IS NULL THEN
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
            IF current_setting('pgdrain.queued_again', true) = 'on' THEN
                -- Queued again by `pgdrain retry`, which reaches the jobs it retries in no set
                -- order: back in id order. A job of the sequence after it that this retry
                -- queued (in this transaction) and none started waits behind it instead. A job
                -- queued before the retry keeps its place: the retried one waits behind it.
                UPDATE pgdrain.active_jobs AS j SET status = 'waiting', updated_at = now()
                WHERE j.sequence = NEW.sequence AND j.status = 'queued' AND j.id > NEW.id
                  AND j.updated_at = now()
                  AND NOT EXISTS (SELECT 1 FROM pgdrain.active_jobs AS r
                                  WHERE r.sequence = NEW.sequence
                                    AND r.status IN ('running', 'parked'));
                -- Not FOUND: this function's variable `found` hides it.
                GET DIAGNOSTICS demoted = ROW_COUNT;
                IF demoted > 0 THEN
                    RETURN NEW;  -- queued, in that job's place
                END IF;
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

DROP TRIGGER jobs_flow_enqueued ON pgdrain.active_jobs;
CREATE TRIGGER jobs_flow_enqueued
    BEFORE INSERT ON pgdrain.active_jobs
    FOR EACH ROW
    WHEN (NEW.sequence IS NOT NULL OR NEW.depends_on IS NOT NULL
          OR NEW.idempotency_key IS NOT NULL)
    EXECUTE FUNCTION pgdrain.jobs_flow_enqueued();
