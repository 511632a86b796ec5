-- pgdrain 0025: a job's run_at is a time every client can read. PostgreSQL stores 'infinity' and
-- years up to 294276; Python's datetime stops at 9999, so one such row, written by another
-- driver or by hand, failed every run's exit check ("timestamp too large") and `pgdrain jobs`
-- ("cannot subtract infinite timestamps"). build_job() refuses such a run_at in one line; this
-- refuses it for every writer, a day inside each end so that no time zone carries it over.
-- NOT VALID, then validated, as migration 0015: a row already in the table that breaks it
-- fails this migration, naming the constraint. Validating reads the active jobs only.
ALTER TABLE pgdrain.active_jobs
    ADD CONSTRAINT jobs_run_at_readable_chk
        CHECK (run_at > '0001-01-02 00:00:00+00' AND run_at < '9999-12-30 00:00:00+00') NOT VALID;
ALTER TABLE pgdrain.active_jobs VALIDATE CONSTRAINT jobs_run_at_readable_chk;
