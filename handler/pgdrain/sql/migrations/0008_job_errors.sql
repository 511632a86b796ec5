-- pgdrain 0008: every failed attempt's error (type, message, bounded traceback, attempt
-- number, time) kept on the job, oldest first, as River keeps its `errors` array; last_error
-- stays the latest one line. IF NOT EXISTS: the operator side may add the same column first.

ALTER TABLE pgdrain.jobs ADD COLUMN IF NOT EXISTS errors jsonb NOT NULL DEFAULT '[]'::jsonb;
