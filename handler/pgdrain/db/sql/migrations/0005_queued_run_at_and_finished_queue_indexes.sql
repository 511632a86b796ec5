-- pgdrain 0005: two partial indexes so that the statements that end a run and `pgdrain stats`
-- cost the same with millions of finished rows as with none.

-- Queued rows by queue and run_at: "is anything ready in queue q" is one probe of the range
-- run_at <= now(), however many delayed jobs wait behind it. jobs_ready_idx orders by priority
-- first, so on it that question walks every delayed row of a lower priority (and, when nothing
-- is ready, every delayed row of the queue). Serves queue_has_ready, queue_depth, the claim's
-- empty-queue guard and the queued/ready counts of queue_stats. Finished rows are not in it,
-- and neither are running ones: a claim adds no entry.
CREATE INDEX jobs_queued_run_at_idx ON pgdrain.jobs (queue, run_at)
    WHERE status = 'queued';

-- Finished rows by queue and status: queue_stats finds the queues that only have history and
-- counts their done/failed rows (up to its bound) from this index alone, without the table.
CREATE INDEX jobs_finished_queue_idx ON pgdrain.jobs (queue, status)
    WHERE status IN ('done', 'failed');
