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
simulator never causes, could lose the last of them.

A trace may ask for a buffered ledger (PGDRAIN_SIM_LEDGER=buffered: the backlog, whose 50,000 short
jobs made two statements each the largest share of the machine's CPU that ten function
processes competed for, a cost a Lambda run does not have). Then the job only appends its row,
timestamped by the process (time.time(): the simulator's server runs on the same machine, so
one clock), and a writer thread inserts what has gathered every FLUSH_EVERY_S in one statement.
The writer is flushed before a hang (which holds the GIL until the kill) and at the end of each
invocation; a process killed otherwise loses at most its last FLUSH_EVERY_S of rows. A row's
run_at is read when it is written, a few milliseconds late: right for jobs that do not fail
(a failure moves run_at to the retry), which is why only the backlog, whose jobs never fail,
uses it."""

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
LEDGER_VARIABLE = "PGDRAIN_SIM_LEDGER"  # "buffered", or unset: a statement per row
FLUSH_EVERY_S = 0.02  # real seconds between the buffered ledger's writes
clock = time.time  # when a buffered row happened
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

# The buffered ledger's rows, in the order they were added (ORDINALITY keeps it in the ids).
_RECORD_MANY = (
    "INSERT INTO pgdrain_sim.ledger (job_id, attempt, phase, env, run_at, at)"
    " SELECT r.job_id, r.attempt, r.phase, %(env)s, j.run_at, to_timestamp(r.at)"
    " FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(phases)s::text[],"
    " %(ats)s::float8[]) WITH ORDINALITY AS r(job_id, attempt, phase, at, n)"
    " LEFT JOIN pgdrain.jobs j ON j.id = r.job_id ORDER BY r.n"
)
Row = tuple[int, int, str, float]  # job id, attempt, phase, when (epoch seconds)

_lock = threading.Lock()
_conn: psycopg.Connection[Any] | None = None


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(
        os.environ["DATABASE_URL"],
        autocommit=True,
        application_name=LEDGER_APPLICATION_NAME,
        connect_timeout=10,
        options="-c synchronous_commit=off",
    )


def _ledger() -> psycopg.Connection[Any]:
    global _conn
    with _lock:
        if _conn is None or _conn.closed:
            _conn = _connect()
        return _conn


class _BufferedLedger:
    """Rows gathered from the job threads and written by one thread of its own."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._rows: list[Row] = []
        self._added = 0
        self._written = 0
        self._waiting = 0  # callers of flush() not yet answered
        self._closing = False
        self._thread = threading.Thread(target=self._write_loop, name="sim-ledger", daemon=True)
        self._thread.start()

    def add(self, row: Row) -> None:
        with self._changed:
            self._rows.append(row)
            self._added += 1
            self._changed.notify_all()

    def flush(self) -> None:
        """Returns once every row added before the call is committed."""
        with self._changed:
            wanted = self._added
            self._waiting += 1
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._written >= wanted)
            self._waiting -= 1

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()

    def _write_loop(self) -> None:
        env = os.environ.get(ENV_ID_VARIABLE, "?")
        with _connect() as conn:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: bool(self._rows) or self._closing)
                    # More rows gather for a while, unless someone waits for them.
                    self._changed.wait_for(
                        lambda: self._closing or self._waiting > 0, timeout=FLUSH_EVERY_S
                    )
                    rows, self._rows = self._rows, []
                if not rows:
                    return  # closing, and everything is written
                conn.execute(_RECORD_MANY, _columns(rows, env))
                with self._changed:
                    self._written += len(rows)
                    self._changed.notify_all()


def _columns(rows: list[Row], env: str) -> dict[str, Any]:
    ids, attempts, phases, ats = zip(*rows, strict=True)
    return {
        "env": env,
        "ids": list(ids),
        "attempts": list(attempts),
        "phases": list(phases),
        "ats": list(ats),
    }


_buffered: _BufferedLedger | None = None


def _buffer() -> _BufferedLedger:
    global _buffered
    with _lock:
        if _buffered is None:
            _buffered = _BufferedLedger()
        return _buffered


def _is_buffered() -> bool:
    return os.environ.get(LEDGER_VARIABLE) == "buffered"


def flush_ledger() -> None:
    if _is_buffered():
        _buffer().flush()


def close_ledger() -> None:
    global _conn, _buffered
    with _lock:
        buffered, _buffered = _buffered, None
        conn, _conn = _conn, None
    if buffered is not None:
        buffered.close()
    if conn is not None:
        conn.close()


def record(job: Job, phase: str) -> None:
    if _is_buffered():
        _buffer().add((job.id, job.attempt, phase, clock()))
        return
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
        flush_ledger()  # the writer thread cannot run once the hang holds the GIL
        sum(range(HANG_RANGE))  # holds the GIL until the process is killed
    time.sleep(float(payload.get("ms", 0)) / 1000.0 / _scale())
    if payload.get("fail_once") and job.attempt == 1:
        record(job, "fail")
        raise RuntimeError("sim: this job fails on its first attempt")
    record(job, "done")
