-- pgdrain 0027: each run's line says whether it kept its done jobs. With PGDRAIN_RETAIN_DONE=0
-- (docs/decisions/0018) a completion deletes the job, so the history's done counts, `stats` and
-- the dashboard's charts leave its done jobs out; the process reading them need not share the
-- function's setting, so the runs record it (run_exit) and `stats` and the dashboard say so.
-- NULL: a line written before this migration. A column without a default: a catalog change.
ALTER TABLE pgdrain.run_history ADD COLUMN done_kept boolean;
