-- pgdrain 0044: a job cancelled while running, queued again by SQL by hand, waits for the
-- cancelled attempt's lease too.
--
-- `pgdrain retry` and the dashboard's retry queue such a job for when its lease ends (migration
-- 0033), as its code may run until then. An UPDATE of pgdrain.jobs by hand, which the
-- dashboard's actions role may make as a retry, could queue it for now: a second run took it
-- beside the first attempt's code. The view's trigger now moves run_at to the lease's end when
-- a finished job is queued again, whoever writes it. One function replaced (its grants kept).

CREATE OR REPLACE FUNCTION pgdrain.jobs_view_write() RETURNS trigger
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cancelled_lease timestamptz;  -- a running job cancelled: when its lease ended
    -- The role the statement runs as (this function's current_user is its owner).
    acting text := CASE WHEN current_setting('role') = 'none' THEN session_user::text
                        ELSE current_setting('role') END;
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM pgdrain.active_jobs WHERE id = OLD.id;
        IF NOT FOUND THEN
            DELETE FROM pgdrain.finished_jobs WHERE id = OLD.id;
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE'
       AND NOT has_column_privilege(acting, 'pgdrain.active_jobs', 'payload', 'UPDATE')
       AND NOT (  -- a retry (job_retry, job_retry_matching)
                   OLD.status IN ('failed', 'parked', 'cancelled') AND NEW.status = 'queued'
               AND NEW.attempts = 0 AND NEW.finished_at IS NULL
               AND NEW.attempt_token IS NULL AND NEW.lease_expires_at IS NULL)
       AND NOT (  -- a cancel (job_cancel, job_cancel_matching)
                   OLD.status IN ('queued', 'running', 'parked', 'waiting')
               AND NEW.status = 'cancelled'
               AND NEW.attempts = OLD.attempts AND NEW.run_at = OLD.run_at
               AND NEW.attempt_token IS NULL AND NEW.lease_expires_at IS NULL) THEN
        RAISE EXCEPTION 'permission denied: role % may only retry or cancel a job', acting
            USING ERRCODE = 'insufficient_privilege', TABLE = 'jobs', SCHEMA = 'pgdrain';
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
            RETURNING has_dependents,
                      CASE WHEN status = 'running' AND NEW.status = 'cancelled'
                           THEN lease_expires_at END
                 INTO NEW.has_dependents, cancelled_lease;
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
             has_dependents, output, progress, cancelled_lease_expires_at)
        VALUES (NEW.id, NEW.queue, NEW.kind, NEW.payload, NEW.status, NEW.priority, NEW.run_at,
                NEW.attempts, NEW.max_attempts, NEW.recovery_policy, NEW.reclaim_count,
                NEW.idempotency_key, NEW.last_error, NEW.created_at, NEW.updated_at,
                NEW.finished_at, NEW.completed_token, NEW.errors, NEW.sequence,
                NEW.depends_on, NEW.has_dependents, NEW.output, NEW.progress, cancelled_lease);
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
        RETURNING cancelled_lease_expires_at INTO cancelled_lease;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- A job cancelled while running, queued again: not before that attempt's lease ends,
        -- as its code may run until then (job_retry waits so; SQL by hand now does too).
        NEW.run_at := greatest(NEW.run_at, cancelled_lease);
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
