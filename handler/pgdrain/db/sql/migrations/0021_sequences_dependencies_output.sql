-- pgdrain 0021: sequences, dependencies and recorded output (docs/jobs.md, decisions/0014).
--
-- A job that must wait (an earlier job of its sequence is unfinished, or a dependency is not
-- done) is inserted `waiting`: in none of the claim's partial indexes, so waiting jobs cost
-- the claim nothing. It becomes `queued` (run_at = now()) in the transaction in which what it
-- waits for finishes, by the row trigger jobs_flow_finished: every way a job finishes (a
-- run's completion, a failure for good, reclaim to failed, an operator's cancel) goes through
-- it, and its WHEN clause, evaluated without calling the function, keeps a drain that uses
-- none of this from paying for it.
--
-- Locks on a live queue: the columns are added without a rewrite (no default, or a constant
-- one), the status CHECK is replaced NOT VALID (every row the old one admitted, the new one
-- admits: no scan), the triggers take a brief lock. The three index builds each read the
-- table while writes to it wait (docs/benchmarks.md, "Sequences and dependencies": 1.8 s in
-- all on 2 M rows, the table locked throughout).

ALTER TABLE pgdrain.jobs
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

-- One row per sequence with unfinished jobs: enqueues of a key, and the finish of its jobs,
-- serialise on it (INSERT ... ON CONFLICT waits for a concurrent one), so two enqueues cannot
-- both see the key free, and a job finishing cannot miss one enqueued behind it.
CREATE TABLE pgdrain.sequences (
    sequence   text        PRIMARY KEY,
    touched_at timestamptz NOT NULL DEFAULT now()
);

-- A sequence's unfinished jobs: is one holding it, and which waits next (lowest id).
CREATE INDEX jobs_sequence_idx ON pgdrain.jobs (sequence, status, id)
    WHERE sequence IS NOT NULL AND status IN ('waiting', 'queued', 'running', 'parked');

-- The waiting jobs that depend on a job that finishes.
CREATE INDEX jobs_waiting_depends_on_idx ON pgdrain.jobs USING gin (depends_on)
    WHERE status = 'waiting';

-- A waiting job holds its idempotency key, as every unfinished one does. job_insert's
-- conflict target (queued, running) implies this predicate too.
DROP INDEX pgdrain.jobs_active_key_idx;
CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running', 'parked', 'waiting');

-- A job enqueued (or queued again by `pgdrain retry`) with a sequence or dependencies: queued
-- if nothing holds it back, else waiting; cancelled at once if a dependency failed or was
-- cancelled; an error naming the id if a dependency does not exist. Every query here is a
-- statement of its own, so in READ COMMITTED each sees what committed before its lock was
-- granted: the sequence's row, or the dependencies' rows (has_dependents is set under the
-- same row lock the dependency's finish takes).
-- SECURITY DEFINER: an enqueuing role needs no rights on pgdrain.sequences nor UPDATE on
-- jobs (enqueuer_role.sql grants INSERT of the two columns).
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
        IF EXISTS (SELECT 1 FROM pgdrain.jobs AS j
                   WHERE j.sequence = NEW.sequence
                     AND j.status IN ('waiting', 'queued', 'running', 'parked')
                     AND j.id <> NEW.id) THEN
            NEW.status := 'waiting';
        END IF;
        RETURN NEW;
    END IF;
    WITH marked AS (
        UPDATE pgdrain.jobs AS d SET has_dependents = true
        WHERE d.id = ANY(NEW.depends_on)
        RETURNING d.id, d.status
    )
    SELECT count(*), count(*) FILTER (WHERE m.status <> 'done'),
           min(m.id) FILTER (WHERE m.status IN ('failed', 'cancelled'))
    INTO found, unfinished, ended
    FROM marked AS m;
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
    BEFORE INSERT ON pgdrain.jobs
    FOR EACH ROW
    WHEN (NEW.sequence IS NOT NULL OR NEW.depends_on IS NOT NULL)
    EXECUTE FUNCTION pgdrain.jobs_flow_enqueued();

CREATE TRIGGER jobs_flow_requeued
    BEFORE UPDATE OF status ON pgdrain.jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('done', 'failed', 'cancelled') AND NEW.status = 'queued'
          AND (NEW.sequence IS NOT NULL OR NEW.depends_on IS NOT NULL))
    EXECUTE FUNCTION pgdrain.jobs_flow_enqueued();

-- A job of a sequence, or with dependents, finished (done, failed for good, cancelled): the
-- next waiting job of its sequence (lowest id) is queued unless another job holds the
-- sequence; dependents whose dependencies are all done are queued; when it failed or was
-- cancelled, its waiting dependents are cancelled (and theirs, as each fires this trigger).
-- Jobs it made ready are reported with a NOTICE (`pgdrain: jobs made ready`): the claim in the
-- statement that completed it cannot see them (one snapshot), so the run claims again.
-- Hangs on the finishing event "status changes to done, failed or cancelled" of
-- pgdrain.jobs; where finishing moves the row to another table, it hangs on that insert.
CREATE FUNCTION pgdrain.jobs_flow_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    made_ready text[] := '{}';  -- the queues of the jobs made ready
    n bigint;
BEGIN
    IF NEW.sequence IS NOT NULL THEN
        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)
        ON CONFLICT (sequence) DO UPDATE SET touched_at = now();
        IF NOT EXISTS (SELECT 1 FROM pgdrain.jobs AS j
                       WHERE j.sequence = NEW.sequence
                         AND j.status IN ('queued', 'running', 'parked')) THEN
            WITH promoted AS (
                UPDATE pgdrain.jobs AS j
                SET status = 'queued', run_at = now(), updated_at = now()
                WHERE j.id = (SELECT w.id FROM pgdrain.jobs AS w
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
    IF OLD.has_dependents AND NEW.status = 'done' THEN
        -- Lock the dependents first, then look at their other dependencies in a statement
        -- of its own: a concurrent finish of another of them has then committed, or waits.
        PERFORM 1 FROM pgdrain.jobs AS d
        WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting'
        ORDER BY d.id
        FOR UPDATE;
        WITH promoted AS (
            UPDATE pgdrain.jobs AS d
            SET status = 'queued', run_at = now(), updated_at = now()
            WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting'
              AND NOT EXISTS (SELECT 1 FROM pgdrain.jobs AS x
                              WHERE x.id = ANY(d.depends_on) AND x.status <> 'done')
            RETURNING d.queue
        )
        SELECT made_ready || array_agg(p.queue) INTO made_ready FROM promoted AS p;
    ELSIF OLD.has_dependents THEN
        UPDATE pgdrain.jobs AS d
        SET status = 'cancelled', finished_at = now(), updated_at = now(),
            last_error = 'cancelled: job ' || NEW.id || ', which it depends on, '
                         || CASE NEW.status WHEN 'failed' THEN 'failed'
                                            ELSE 'was cancelled' END
        WHERE d.depends_on @> ARRAY[NEW.id] AND d.status = 'waiting';
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

CREATE TRIGGER jobs_flow_finished
    AFTER UPDATE OF status ON pgdrain.jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('done', 'failed', 'cancelled') AND OLD.status <> NEW.status
          AND (OLD.sequence IS NOT NULL OR OLD.has_dependents))
    EXECUTE FUNCTION pgdrain.jobs_flow_finished();
