-- pgdrain 0006: the control plane's state, so that PostgreSQL is its only coordinator.

-- Trailing-edge kicks: when a kick was last asked for, beside when one last invoked. A run
-- that is about to exit compares requested_at with its own clock (pgdrain.aws.control).
ALTER TABLE pgdrain.kicks ADD COLUMN requested_at timestamptz NOT NULL DEFAULT '-infinity';

-- Pending wake-ups: one row per set of queues, the earliest one-shot schedule known to exist
-- (state 'created') or being created by a run (state 'creating', which holds only until
-- reserved_until: a run killed between reserving and creating suppresses nothing for long).
CREATE TABLE pgdrain.wakes (
    queue_set      text        PRIMARY KEY,  -- the queues, sorted and comma-joined
    wake_at        timestamptz NOT NULL,
    state          text        NOT NULL,
    reserved_by    text        NOT NULL,
    reserved_until timestamptz NOT NULL,
    CONSTRAINT wakes_state_chk CHECK (state IN ('creating', 'created'))
);

-- Runs alive now: registered when a run connects (or reserved by the run that spawns it),
-- deleted when it exits. A row past its deadline counts for nothing (its run was killed).
CREATE TABLE pgdrain.runs (
    run_id     text        PRIMARY KEY,
    queues     text[]      NOT NULL,
    chain      integer     NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    deadline   timestamptz NOT NULL
);

-- One row whose lock serialises fan-out decisions, so the PGDRAIN_MAX_RUNS cap holds.
CREATE TABLE pgdrain.run_gate (
    id boolean PRIMARY KEY DEFAULT true,
    CONSTRAINT run_gate_one_row_chk CHECK (id)
);
INSERT INTO pgdrain.run_gate DEFAULT VALUES;
