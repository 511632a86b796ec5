-- pgdrain 0019: the runs that ended, for the dashboard's control page and `pgdrain runs`.
-- pgdrain.runs holds live runs only (a run deletes its row as it exits); a run's exit
-- (run_exit, control_plane.sql) now also writes its line here, in the same statement, so the
-- history costs no round trip. One row per run, keyed by the run's id (pgdrain.runs.run_id):
-- the exit sent again after a lost reply writes nothing more. A run that never exits (killed,
-- or ended by an error) leaves no row: it stays in pgdrain.runs past its deadline until another
-- run's exit forgets it an hour later. Bounded: a scheduled run's retention deletes rows older
-- than PGDRAIN_RETAIN_DONE days, with its batch of done jobs (job_retention_batch).
CREATE TABLE pgdrain.run_history (
    run_id        text        PRIMARY KEY,
    "trigger"     text        NOT NULL,  -- the event's reason: schedule, enqueue, wake, ...
    queues        text[]      NOT NULL,  -- {*}: every queue, as in pgdrain.runs
    chain         integer     NOT NULL,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    stop_reason   text        NOT NULL,  -- empty or budget: the two ways a run exits
    claimed       integer     NOT NULL,
    done          integer     NOT NULL,
    retried       integer     NOT NULL,
    failed        integer     NOT NULL,
    lease_lost    integer     NOT NULL,
    reclaimed     integer     NOT NULL,
    released      integer     NOT NULL,
    drained_again integer     NOT NULL,
    lingered      integer     NOT NULL,
    continued     boolean     NOT NULL
);
-- Newest first for the page, oldest first for retention.
CREATE INDEX run_history_finished_at_idx ON pgdrain.run_history (finished_at);

-- A run's exit now writes here: a worker role granted before this migration (worker_role.sql)
-- would fail every exit until the file is run again, so the grants it makes are made here too,
-- to the roles that exist (the role files make them on a database that has none yet).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_worker') THEN
        GRANT SELECT, INSERT, DELETE ON pgdrain.run_history TO pgdrain_worker;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard') THEN
        GRANT SELECT ON pgdrain.run_history TO pgdrain_dashboard;
    END IF;
END
$$;
