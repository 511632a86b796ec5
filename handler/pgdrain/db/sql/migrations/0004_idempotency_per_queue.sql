-- pgdrain 0004: an idempotency key is unique per queue, and only among jobs that are not
-- finished (queued or running). A done or failed job frees its key: the same key enqueues a
-- new job. (Before: one key per database, for ever.) Every row that was valid under the old
-- index is valid under the new one, which only allows more.

DROP INDEX IF EXISTS pgdrain.jobs_idempotency_key_idx;

CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running');
