-- pgdrain 0017: the finished rows' index by queue and status gains the id, so that a list of
-- one status (`pgdrain jobs --status failed`, the dashboard's jobs page) reads the newest rows
-- of each queue from it, in order, however long the history: without the id, the list walked
-- the table backwards by id until it found a page of that status (every row, when none
-- matched). The same rows as before: a job's completion writes no more entries than it did.
-- queue_stats' bounded counts still read the index alone, through its first two columns.
DROP INDEX pgdrain.jobs_finished_queue_idx;
CREATE INDEX jobs_finished_queue_idx ON pgdrain.jobs (queue, status, id)
    WHERE status IN ('done', 'failed', 'parked', 'cancelled');
