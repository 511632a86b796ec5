-- pgdrain 0022: waiting jobs (a sequence's later jobs, a job whose dependencies have not finished)
-- counted per queue by `pgdrain stats` and the dashboard's queues page, as the other statuses
-- are. Partial: only waiting rows have an entry, so enqueueing a plain job, its claim and its
-- completion write none. The build reads active_jobs (the work in flight, not the history)
-- and holds off writes to it meanwhile: milliseconds for a backlog of thousands, about a
-- second per million active rows.
CREATE INDEX jobs_waiting_queue_idx ON pgdrain.active_jobs (queue) WHERE status = 'waiting';
