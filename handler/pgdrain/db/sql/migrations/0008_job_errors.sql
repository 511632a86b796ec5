-- pgdrain 0008: every failed attempt's error (type, message, bounded traceback, attempt
-- number, time) kept on the job, oldest first, as River keeps its `errors` array; last_error
-- stays the latest one line. IF NOT EXISTS: the operator side may add the same column first.

ALTER TABLE pgdrain.jobs ADD COLUMN IF NOT EXISTS errors jsonb NOT NULL DEFAULT '[]'::jsonb;

-- The latest slot enqueued for each periodic kind (pgdrain.periodic): a slot is enqueued only
-- when it is later than this, so once, however many runs start, and whatever later happens
-- to its job (done, its idempotency key freed, purged), as Procrastinate's periodic defers.
CREATE TABLE IF NOT EXISTS pgdrain.periodic_slots (
    kind        text        PRIMARY KEY,
    slot        timestamptz NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
