-- pgdrain 0021: sequences, dependencies and recorded output (docs/jobs.md, decisions/0014).
--
-- A job that must wait (an earlier job of its sequence is unfinished, or a dependency is not
-- done) is inserted `waiting` into active_jobs: in none of the claim's partial indexes, so
-- waiting jobs cost the claim nothing. It becomes `queued` (run_at = now()) in the transaction
-- in which what it waits for finishes, by the row trigger jobs_flow_finished. Every way a job
-- finishes (a run's completion, a failure for good, reclaim to failed, the job's own Cancel,
-- an operator's cancel through the view) moves its row into pgdrain.finished_jobs (0018), so
-- the trigger hangs on that insert; its WHEN clause, evaluated without calling the function,
-- keeps a drain that uses none of this from paying for it.
--
-- Locks on a live queue: the columns are added without a rewrite (no default, or a constant
-- one), the checks are added NOT VALID (no scan), the triggers and the view take a brief lock.
-- The three index builds each read active_jobs (the work in flight, once 0018's history has
-- moved) while writes to it wait (docs/benchmarks.md, "Sequences and dependencies").

ALTER TABLE pgdrain.active_jobs
    ADD COLUMN sequence text,
    ADD COLUMN depends_on bigint[],
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN output jsonb,
    ADD COLUMN progress jsonb,
    DROP CONSTRAINT jobs_status_chk,
    ADD CONSTRAINT jobs_status_chk
        CHECK (status IN ('queued', 'running', 'done', 'failed', 'parked', 'cancelled',
                          'waiting')) NOT VALID,
    -- A sequence key as an idempotency key; at most 100 dependencies; one or the other.
    ADD CONSTRAINT jobs_sequence_chk
        CHECK (sequence IS NULL OR length(sequence) BETWEEN 1 AND 500) NOT VALID,
    ADD CONSTRAINT jobs_depends_on_chk
        CHECK (depends_on IS NULL OR cardinality(depends_on) BETWEEN 1 AND 100) NOT VALID,
    ADD CONSTRAINT jobs_flow_chk CHECK (sequence IS NULL OR depends_on IS NULL) NOT VALID;

-- The same columns in the history, each partition (and each made later: LIKE copies them).
ALTER TABLE pgdrain.finished_jobs
    ADD COLUMN sequence text,
    ADD COLUMN depends_on bigint[],
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN output jsonb,
    ADD COLUMN progress jsonb,
    ADD CONSTRAINT finished_jobs_sequence_chk
        CHECK (sequence IS NULL OR length(sequence) BETWEEN 1 AND 500) NOT VALID,
    ADD CONSTRAINT finished_jobs_depends_on_chk
        CHECK (depends_on IS NULL OR cardinality(depends_on) BETWEEN 1 AND 100) NOT VALID,
    ADD CONSTRAINT finished_jobs_flow_chk
        CHECK (sequence IS NULL OR depends_on IS NULL) NOT VALID;

-- One row per sequence with unfinished jobs: enqueues of a key, and the finish of its jobs,
-- serialise on it (INSERT ... ON CONFLICT waits for a concurrent one), so two enqueues cannot
-- both see the key free, and a job finishing cannot miss one enqueued behind it.
CREATE TABLE pgdrain.sequences (
    sequence   text        PRIMARY KEY,
    touched_at timestamptz NOT NULL DEFAULT now()
);

-- A sequence's unfinished jobs: is one holding it, and which waits next (lowest id).
CREATE INDEX jobs_sequence_idx ON pgdrain.active_jobs (sequence, status, id)
    WHERE sequence IS NOT NULL AND status IN ('waiting', 'queued', 'running', 'parked');

-- The waiting jobs that depend on a job that finishes.
CREATE INDEX jobs_waiting_depends_on_idx ON pgdrain.active_jobs USING gin (depends_on)
    WHERE status = 'waiting';

-- A waiting job holds its idempotency key, as every unfinished one does. job_insert's
-- conflict target (queued, running) implies this predicate too.
DROP INDEX pgdrain.jobs_active_key_idx;
CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.active_jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running', 'parked', 'waiting');

-- The view: 0018's columns, then 0021's (a view gains columns only at its end).
CREATE OR REPLACE VIEW pgdrain.jobs AS
SELECT id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
       recovery_policy, reclaim_count, lease_expires_at, leased_by, attempt_token,
       heartbeat_at, idempotency_key, last_error, created_at, updated_at, finished_at,
       completed_token, errors, claim_id, sequence, depends_on, has_dependents, output, progress
FROM pgdrain.active_jobs
UNION ALL
SELECT id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
       recovery_policy, reclaim_count, NULL::timestamptz, NULL::text, NULL::uuid,
       NULL::timestamptz, idempotency_key, last_error, created_at, updated_at, finished_at,
       completed_token, errors, NULL::uuid, sequence, depends_on, has_dependents, output,
       progress
FROM pgdrain.finished_jobs;

ALTER VIEW pgdrain.jobs ALTER COLUMN has_dependents SET DEFAULT false;

-- 0018's writes through the view, carrying 0021's columns across a move.
CREATE OR REPLACE FUNCTION pgdrain.jobs_view_write() RETURNS trigger
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM pgdrain.active_jobs WHERE id = OLD.id;
        IF NOT FOUND THEN
            DELETE FROM pgdrain.finished_jobs WHERE id = OLD.id;
        END IF;
        RETURN OLD;
    END IF;
    NEW.has_dependents := coalesce(NEW.has_dependents, false);
    -- An UPDATE writes the row only as the statement read it (its status and token unchanged):
    -- the view's rows are not locked when read (not even by FOR UPDATE), so two statements that
    -- read the same queued job (two claims of an older pgdrain) must not both take it. The one
    -- that comes second waits for the first's row lock, finds the row changed, and writes
    -- nothing for it (RETURN NULL: the row is not reported as updated).
    IF NEW.status IN ('done', 'failed', 'cancelled') THEN
        -- finished_jobs has no lease columns: a finished row with a lease is refused as the
        -- table's CHECK refused it (0001).
        IF NEW.lease_expires_at IS NOT NULL OR NEW.leased_by IS NOT NULL
           OR NEW.attempt_token IS NOT NULL OR NEW.heartbeat_at IS NOT NULL THEN
            RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_lease_chk"'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_lease_chk',
                      TABLE = 'jobs', SCHEMA = 'pgdrain';
        END IF;
        NEW.finished_at := coalesce(NEW.finished_at, now());
        NEW.claim_id := NULL;
        IF TG_OP = 'UPDATE' THEN
            UPDATE pgdrain.finished_jobs SET
                (queue, kind, payload, status, priority, run_at, attempts, max_attempts,
                 recovery_policy, reclaim_count, idempotency_key, last_error, created_at,
                 updated_at, finished_at, completed_token, errors, sequence, depends_on,
                 has_dependents, output, progress)
              = (NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
                 NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
                 NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
                 NEW.finished_at, NEW.completed_token, NEW.errors, NEW.sequence,
                 NEW.depends_on, NEW.has_dependents, NEW.output, NEW.progress)
            WHERE id = OLD.id
              AND status = OLD.status  -- as the statement read it
            ;
            IF FOUND THEN
                RETURN NEW;
            END IF;
            -- has_dependents as the row holds it now: an enqueue may have set it after the
            -- statement read the row (it waited for that enqueue's row lock).
            DELETE FROM pgdrain.active_jobs
            WHERE id = OLD.id
              AND status = OLD.status  -- as the statement read it
              AND attempt_token IS NOT DISTINCT FROM OLD.attempt_token  -- as the statement read it
            RETURNING has_dependents INTO NEW.has_dependents;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
        END IF;
        -- Into finished_jobs: jobs_flow_finished fires here for a job of a sequence or with
        -- dependents.
        INSERT INTO pgdrain.finished_jobs
            (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
             recovery_policy, reclaim_count, idempotency_key, last_error, created_at,
             updated_at, finished_at, completed_token, errors, sequence, depends_on,
             has_dependents, output, progress)
        VALUES (NEW.id, NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
                NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
                NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
                NEW.finished_at, NEW.completed_token, NEW.errors, NEW.sequence,
                NEW.depends_on, NEW.has_dependents, NEW.output, NEW.progress);
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        UPDATE pgdrain.active_jobs SET
            (queue, kind, payload, status, priority, run_at, attempts, max_attempts,
             recovery_policy, reclaim_count, lease_expires_at, leased_by, attempt_token,
             heartbeat_at, idempotency_key, last_error, created_at, updated_at, finished_at,
             completed_token, errors, claim_id, sequence, depends_on, output, progress)
          = (NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
             NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
             NEW.lease_expires_at, NEW.leased_by, NEW.attempt_token, NEW.heartbeat_at,
             NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
             NEW.finished_at, NEW.completed_token, NEW.errors, NEW.claim_id, NEW.sequence,
             NEW.depends_on, NEW.output, NEW.progress)
        WHERE id = OLD.id
          AND status = OLD.status  -- as the statement read it
          AND attempt_token IS NOT DISTINCT FROM OLD.attempt_token  -- as the statement read it
        ;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        DELETE FROM pgdrain.finished_jobs
        WHERE id = OLD.id
          AND status = OLD.status  -- as the statement read it
        ;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    -- Into active_jobs (an insert, or a finished job queued again by `pgdrain retry`):
    -- jobs_flow_enqueued decides queued or waiting for a job of a sequence or with
    -- dependencies.
    INSERT INTO pgdrain.active_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, lease_expires_at, leased_by, attempt_token,
         heartbeat_at, idempotency_key, last_error, created_at, updated_at, finished_at,
         completed_token, errors, claim_id, sequence, depends_on, has_dependents, output,
         progress)
    OVERRIDING SYSTEM VALUE VALUES
           (NEW.id, NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
            NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
            NEW.lease_expires_at, NEW.leased_by, NEW.attempt_token, NEW.heartbeat_at,
            NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
            NEW.finished_at, NEW.completed_token, NEW.errors, NEW.claim_id, NEW.sequence,
            NEW.depends_on, NEW.has_dependents, NEW.output, NEW.progress);
    RETURN NEW;
END
$$;

-- A job inserted into active_jobs with a sequence or dependencies (an enqueue, or `pgdrain
-- retry` of a finished one through the view): queued if nothing holds it back, else waiting;
-- cancelled at once if a dependency failed or was cancelled (jobs_flow_cancelled then moves
-- it to finished_jobs); an error naming the id if a dependency does not exist. Every query
-- here is a statement of its own, so in READ COMMITTED each sees what committed before its
-- lock was granted: the sequence's row, or the dependencies' rows (has_dependents is set under
-- the row lock the dependency's move out of active_jobs waits for).
-- SECURITY DEFINER: an enqueuing role needs no rights on pgdrain.sequences, finished_jobs, nor
-- UPDATE on active_jobs (enqueuer_role.sql grants INSERT of the two columns).
CREATE FUNCTION pgdrain.jobs_flow_enqueued() RETURNS trigger
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
    IF found < (SELECT count(DISTINCT d) FROM unnest(NEW.depends_on) AS d) THEN
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

CREATE TRIGGER jobs_flow_enqueued
    BEFORE INSERT ON pgdrain.active_jobs
    FOR EACH ROW
    WHEN (NEW.sequence IS NOT NULL OR NEW.depends_on IS NOT NULL)
    EXECUTE FUNCTION pgdrain.jobs_flow_enqueued();

-- A job cancelled at its enqueue (a dependency failed or was cancelled) leaves active_jobs for
-- finished_jobs at once, in the statement that inserted it (which still returns its id).
CREATE FUNCTION pgdrain.jobs_flow_cancelled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgdrain.active_jobs AS j WHERE j.id = NEW.id AND j.status = 'cancelled';
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    VALUES (NEW.id, NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
            NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
            NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
            coalesce(NEW.finished_at, now()), NEW.completed_token, NEW.errors, NEW.sequence,
            NEW.depends_on, NEW.has_dependents, NEW.output, NEW.progress);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_flow_cancelled
    AFTER INSERT ON pgdrain.active_jobs
    FOR EACH ROW
    WHEN (NEW.depends_on IS NOT NULL AND NEW.status = 'cancelled')
    EXECUTE FUNCTION pgdrain.jobs_flow_cancelled();

-- A job of a sequence, or with dependents, finished (done, failed for good, cancelled) and
-- moved into finished_jobs: the next waiting job of its sequence (lowest id) is queued unless
-- another job holds the sequence; dependents whose dependencies are all done are queued; when
-- it failed or was cancelled, its waiting dependents are cancelled, moved to finished_jobs in
-- turn (and theirs, as each insert fires this trigger).
-- Jobs it made ready are reported with a NOTICE (`pgdrain: jobs made ready`): the claim in the
-- statement that completed it cannot see them (one snapshot), so the run claims again.
CREATE FUNCTION pgdrain.jobs_flow_finished() RETURNS trigger
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
                SET status = 'queued', run_at = now(), updated_at = now()
                WHERE j.id = (SELECT w.id FROM pgdrain.active_jobs AS w
                              WHERE w.sequence = NEW.sequence AND w.status = 'waiting'
                              ORDER BY w.id LIMIT 1)
                RETURNING j.queue
            )
            SELECT count(*), coalesce(array_agg(p.queue), made_ready) INTO n, made_ready
            FROM promoted AS p;
            IF n = 0 THEN
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
            SET status = 'queued', run_at = now(), updated_at = now()
            WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting'
              AND NOT EXISTS (SELECT 1 FROM pgdrain.active_jobs AS x
                              WHERE x.id = ANY(d.depends_on))
              AND NOT EXISTS (SELECT 1 FROM pgdrain.finished_jobs AS x
                              WHERE x.id = ANY(d.depends_on) AND x.status <> 'done')
            RETURNING d.queue
        )
        SELECT made_ready || array_agg(p.queue) INTO made_ready FROM promoted AS p;
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
-- The NOTICE reaches the run whatever the role's client_min_messages says.
ALTER FUNCTION pgdrain.jobs_flow_finished() SET client_min_messages = 'notice';

-- On the partitioned table: cloned to each partition, and to each finished_jobs_partition_ensure
-- attaches later.
CREATE TRIGGER jobs_flow_finished
    AFTER INSERT ON pgdrain.finished_jobs
    FOR EACH ROW
    WHEN (NEW.sequence IS NOT NULL OR NEW.has_dependents)
    EXECUTE FUNCTION pgdrain.jobs_flow_finished();
