-- pgdrain 0012: a parked job holds its idempotency key.

-- 1. Idempotency keys: held by queued, running and parked jobs; freed by done, failed and
-- cancelled (as River's unique states leave out cancelled and discarded jobs). A parked job's
-- run died during an attempt whose work may have happened, and a person decides whether it runs
-- again (`pgdrain retry`, which keeps the key with it): a new job with its key would do that
-- work a second time. Until now a parked job freed its key, so a job enqueued since may share
-- it. Where jobs share a key, the queued or running one keeps it, else the newest parked one; a
-- parked job that yields is cancelled (retried by id once the key is free), with a line saying why.
WITH keeper AS (
    SELECT DISTINCT ON (queue, idempotency_key) id, queue, idempotency_key
    FROM pgdrain.jobs
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running', 'parked')
    ORDER BY queue, idempotency_key, status = 'parked', id DESC
)
UPDATE pgdrain.jobs AS j
SET status = 'cancelled',
    finished_at = now(),
    updated_at = now(),
    last_error = 'cancelled by migration 0012: parked, its idempotency key is held by job '
                 || k.id || ' (retry it once that job is finished); before: '
                 || coalesce(j.last_error, '')
FROM keeper AS k
WHERE j.status = 'parked'
  AND j.queue = k.queue
  AND j.idempotency_key = k.idempotency_key
  AND j.id <> k.id;

DROP INDEX pgdrain.jobs_active_key_idx;
CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running', 'parked');
