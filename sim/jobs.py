"""The simulator's job kinds (PGDRAIN_JOBS=sim.jobs), and the ledger they write.

`sim.work` sleeps for payload["ms"] simulated milliseconds (I/O-bound work, scaled like every
other duration), may fail on its first attempt (payload["fail_once"]) or, in a function
process, hang on it until the function is killed at its timeout (payload["hang_first"]; the
polling worker has no timeout that would end such a hang, so there the job just runs).
Each attempt writes a `start` row into pgdrain_sim.ledger when it begins and a `done` or
`fail` row when it ends, with the job's run_at as the database holds it at the start (the
moment this attempt became due) and the execution environment that ran it;
a killed attempt leaves only its `start` row.

The ledger connection is this process's own (application_name pgdrain-sim-ledger, so that the
simulator does not count it as the drain's), shared by the run's worker threads (a psycopg
connection is thread-safe), and closed after each invocation so that nothing stays connected
between runs. Its commits do not wait for the WAL flush (synchronous_commit off, for this
connection only): the ledger is the simulator's instrument, not the jobs' work, and with two
rows per job a flush each made it the bottleneck of a backlog of short jobs (every system's
alike). The rows are still committed before the job goes on; only a server crash, which the
simulator never causes, could lose the last of them."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from pgdrain import Job, Registry

jobs = Registry()

KIND = "sim.work"
SCALE_VARIABLE = "PGDRAIN_SIM_SCALE"
ENV_ID_VARIABLE = "PGDRAIN_SIM_ENV"
FUNCTION_VARIABLE = "AWS_LAMBDA_FUNCTION_NAME"  # set in the function's processes only
LEDGER_APPLICATION_NAME = "pgdrain-sim-ledger"
# A hang that holds the GIL (a long call into C, as a stuck CPU-bound job or C extension
# does): the drain's own thread cannot return at its deadline, so Lambda's timeout kills the
# process. (A hang that sleeps would not do: the drain returns before its deadline and leaves
# the thread behind.) Hours long: the stand-in's SIGKILL at the timeout ends it.
HANG_RANGE = 10**14

LEDGER_DDL = (
    "CREATE SCHEMA IF NOT EXISTS pgdrain_sim",
    """CREATE TABLE IF NOT EXISTS pgdrain_sim.ledger (
        id      bigserial   PRIMARY KEY,
        job_id  bigint      NOT NULL,
        attempt integer     NOT NULL,
        phase   text        NOT NULL CHECK (phase IN ('start', 'done', 'fail')),
        env     text        NOT NULL,
        run_at  timestamptz,
        at      timestamptz NOT NULL DEFAULT clock_timestamp()
    )""",
)
_RECORD = (
    "INSERT INTO pgdrain_sim.ledger (job_id, attempt, phase, env, run_at)"
    " SELECT %(id)s, %(attempt)s, %(phase)s, %(env)s,"
    " (SELECT run_at FROM pgdrain.jobs WHERE id = %(id)s)"
)

_lock = threading.Lock()
_conn: psycopg.Connection[Any] | None = None


def _ledger() -> psycopg.Connection[Any]:
    global _conn
    with _lock:
        if _conn is None or _conn.closed:
            _conn = psycopg.connect(
                os.environ["DATABASE_URL"],
                autocommit=True,
                application_name=LEDGER_APPLICATION_NAME,
                connect_timeout=10,
                options="-c synchronous_commit=off",
            )
        return _conn


def close_ledger() -> None:
    global _conn
    with _lock:
        if _conn is not None:
            _conn.close()
            _conn = None


def record(job: Job, phase: str) -> None:
    params = {
        "id": job.id,
        "attempt": job.attempt,
        "phase": phase,
        "env": os.environ.get(ENV_ID_VARIABLE, "?"),
    }
    _ledger().execute(_RECORD, params)


def _scale() -> float:
    return float(os.environ.get(SCALE_VARIABLE, "1"))


@jobs.job(KIND)
def work(job: Job) -> None:
    record(job, "start")
    payload = job.payload if isinstance(job.payload, dict) else {}
    if payload.get("hang_first") and job.attempt == 1 and os.environ.get(FUNCTION_VARIABLE):
        sum(range(HANG_RANGE))  # holds the GIL until the process is killed
    time.sleep(float(payload.get("ms", 0)) / 1000.0 / _scale())
    if payload.get("fail_once") and job.attempt == 1:
        record(job, "fail")
        raise RuntimeError("sim: this job fails on its first attempt")
    record(job, "done")
