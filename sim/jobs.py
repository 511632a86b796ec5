"""The simulator's job kinds (PGDRAIN_JOBS=sim.jobs), and the ledger they write.

`sim.work` sleeps for payload["ms"] simulated milliseconds (I/O-bound work, scaled like every
other duration), may fail on its first attempt (payload["fail_once"]) or, in a function
process, hang on it until the function is killed at its timeout (payload["hang_first"]; the
polling worker has no timeout that would end such a hang, so there the job just runs).
Each attempt writes a `start` row into pgdrain_sim.ledger when it begins and a `done` or
`fail` row when it ends, with the job's run_at as the database holds it at the start (the
moment this attempt became due) and the execution environment that ran it;
a killed attempt leaves only its `start` row.

The ledger connections are this process's own (application_name pgdrain-sim-ledger, so that the
simulator does not count them as the drain's): up to LEDGER_CONNECTIONS, each used by one worker
thread at a time, and closed after each invocation so that nothing stays connected between runs.
(One connection shared by a run's ten threads made the jobs queue for it: with ten runs, a 20 ms
job took 30 ms from its start row to its done row at the median and 110 ms at p99, and each run
drained 135 jobs a second of the 500 its ten threads could.) Their commits do not wait for the
WAL flush (synchronous_commit off, for these connections only): the ledger is the simulator's
instrument, not the jobs' work, and with two rows per job a flush each made it the bottleneck
of a backlog of short jobs (every system's alike). The rows are still committed before the job
goes on; only a server crash, which the simulator never causes, could lose the last of them."""

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

# Per process: ten runs of ten threads stay within the server's connection limit.
LEDGER_CONNECTIONS = 4

_lock = threading.Condition()
_idle: list[psycopg.Connection[Any]] = []
_opened: list[psycopg.Connection[Any]] = []


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(
        os.environ["DATABASE_URL"],
        autocommit=True,
        application_name=LEDGER_APPLICATION_NAME,
        connect_timeout=10,
        options="-c synchronous_commit=off",
    )


def _take() -> psycopg.Connection[Any]:
    """An idle ledger connection, a new one while fewer than LEDGER_CONNECTIONS are open, or
    the next one given back."""
    with _lock:
        while True:
            while _idle:
                conn = _idle.pop()
                if not conn.closed:
                    return conn
                _opened.remove(conn)
            if len(_opened) < LEDGER_CONNECTIONS:
                conn = _connect()
                _opened.append(conn)
                return conn
            _lock.wait()


def _give_back(conn: psycopg.Connection[Any]) -> None:
    with _lock:
        _idle.append(conn)
        _lock.notify()


def close_ledger() -> None:
    with _lock:
        for conn in _opened:
            conn.close()
        _opened.clear()
        _idle.clear()


def record(job: Job, phase: str) -> None:
    params = {
        "id": job.id,
        "attempt": job.attempt,
        "phase": phase,
        "env": os.environ.get(ENV_ID_VARIABLE, "?"),
    }
    conn = _take()
    try:
        conn.execute(_RECORD, params)
    finally:
        _give_back(conn)


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
