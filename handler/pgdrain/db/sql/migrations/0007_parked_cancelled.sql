-- pgdrain 0007: two more states an operator sees and acts on, and the column for each
-- attempt's error.
--   parked:    a running job with recovery_policy 'manual' whose lease expired: reclaim leaves
--              it for a person to look at (`pgdrain jobs --status parked`, `pgdrain retry`)
--              instead of running it again or counting it among ordinary failures.
--   cancelled: an operator cancelled it (`pgdrain cancel`); it never runs (again), and a run
--              still holding it loses its lease, so its outcome is refused by the fence.
-- The lease CHECK (a lease exactly while running) is unchanged and covers both.

ALTER TABLE pgdrain.jobs DROP CONSTRAINT jobs_status_chk;
ALTER TABLE pgdrain.jobs ADD CONSTRAINT jobs_status_chk
    CHECK (status IN ('queued', 'running', 'done', 'failed', 'parked', 'cancelled'));

-- Each attempt's error, oldest first: [{"attempt", "at", "type", "message", "traceback"}].
-- Migration 0008 (the job-author half) adds the same column the same way, so whichever of the
-- two runs first creates it and the other changes nothing.
ALTER TABLE pgdrain.jobs ADD COLUMN IF NOT EXISTS errors jsonb NOT NULL DEFAULT '[]';

-- What retention and purge scan: finished rows by age, cancelled ones included.
DROP INDEX pgdrain.jobs_finished_idx;
CREATE INDEX jobs_finished_idx ON pgdrain.jobs (finished_at)
    WHERE status IN ('done', 'failed', 'cancelled');

-- What queue_stats counts per queue from the index alone: the history now includes parked and
-- cancelled jobs (0005 made it for done and failed).
DROP INDEX pgdrain.jobs_finished_queue_idx;
CREATE INDEX jobs_finished_queue_idx ON pgdrain.jobs (queue, status)
    WHERE status IN ('done', 'failed', 'parked', 'cancelled');
