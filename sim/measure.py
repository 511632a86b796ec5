"""What the database saw, and the figures made of it.

A sampler reads pg_stat_activity every 100 ms (real) and counts, per database, the connections
named `pgdrain` (the drain's own; the sim's ledger, driver and sampler connections have other
names). The figures, in simulated units:
- awake_minutes: a database is awake from any activity of the drain until 5 minutes after it
  (the suspend rule), so awake time is the union of [t, t + 5 min] over the samples showing a
  drain connection and the statements the drain ran on pgdrain.active_jobs (INSTRUMENT_DDL);
- ideal_awake_minutes: the same union over the moments work became due (every attempt's due);
- delays: for every attempt in the ledger, from the moment it became due to its start. An
  attempt's due moment is its job's run_at when it started (the enqueue's moment plus any
  delay, or the retry's backoff), except after an attempt that was killed: then the SIGKILL's
  moment, when its lease ended at the deadline (pgdrain sets run_at to the reclaim's moment,
  which would hide the wait for a reclaim);
- makespan: from the first job's creation to the last `done` (of the trace's main queue: the
  backlog's trickle queue has its own record, backlog-trickle);
- lost: jobs not done when the trace ends; double_completions: jobs with two `done` rows."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgdrain.db.connection import APPLICATION_NAME
from sim.timescale import Scale

SAMPLE_INTERVAL_S = 0.1  # real
SUSPEND_AFTER_S = 300.0  # simulated: Neon's 5 minutes, Aurora's 300 s
SAMPLER_APPLICATION_NAME = "pgdrain-sim-sampler"

# A statement log kept by the database: every statement of a drain connection that updates
# pgdrain.active_jobs (every run reclaims and claims, even when nothing matches) leaves its
# moment, so that a run too short for the 100 ms samples (an empty scheduled run takes a few
# ms) still counts as activity. Instrumentation of the sim's own database; pgdrain's schema is
# unchanged.
INSTRUMENT_DDL = (
    "CREATE TABLE IF NOT EXISTS pgdrain_sim.activity"
    " (at timestamptz NOT NULL DEFAULT clock_timestamp())",
    """CREATE OR REPLACE FUNCTION pgdrain_sim.note_activity() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF current_setting('application_name') = 'pgdrain' THEN
            INSERT INTO pgdrain_sim.activity DEFAULT VALUES;
        END IF;
        RETURN NULL;
    END $$""",
    "CREATE OR REPLACE TRIGGER pgdrain_sim_activity AFTER UPDATE ON pgdrain.active_jobs"
    " FOR EACH STATEMENT EXECUTE FUNCTION pgdrain_sim.note_activity()",
)


class Sampler:
    """Samples pg_stat_activity for the given databases until stopped."""

    def __init__(self, url: str, databases: Sequence[str]) -> None:
        self._url, self._databases = url, list(databases)
        self.samples: dict[str, list[tuple[float, int]]] = {d: [] for d in databases}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        query = (
            "SELECT datname, count(*) FROM pg_stat_activity"
            " WHERE datname = ANY(%s) AND application_name = %s GROUP BY datname"
        )
        with psycopg.connect(
            self._url, autocommit=True, application_name=SAMPLER_APPLICATION_NAME
        ) as conn:
            next_at = time.time()
            while not self._stop.is_set():
                now = time.time()
                rows = conn.execute(query, (self._databases, APPLICATION_NAME)).fetchall()
                counts = {str(name): int(n) for name, n in rows}
                for database in self._databases:
                    self.samples[database].append((now, counts.get(database, 0)))
                next_at += SAMPLE_INTERVAL_S
                self._stop.wait(max(0.0, next_at - time.time()))


@dataclass
class Figures:
    trace: str
    system: str
    awake_minutes: float
    ideal_awake_minutes: float
    invocations: int
    peak_runs: int
    peak_connections: int
    p50_delay_s: float | None
    p99_delay_s: float | None
    max_delay_s: float | None
    makespan_s: float | None
    lost: int
    double_completions: int
    extra: dict[str, Any] = field(default_factory=dict)  # not in the JSON: the report's notes


@dataclass(frozen=True)
class Attempt:
    job_id: int
    queue: str
    attempt: int
    due: float  # simulated seconds of the trace
    started: float


def awake_seconds(moments: Iterable[float], hold: float = SUSPEND_AFTER_S) -> float:
    """The length of the union of [m, m + hold] over the moments."""
    total, end = 0.0, -math.inf
    for moment in sorted(moments):
        if moment >= end:
            total += hold
        else:
            total += moment + hold - end
        end = max(end, moment + hold)
    return total


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1), nearest rank: a figure that happened, not an interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def read_attempts(
    conn: psycopg.Connection[Any], scale: Scale, kills: Mapping[str, float]
) -> list[Attempt]:
    rows = conn.execute(
        "SELECT l.job_id, j.queue, l.attempt, l.phase, l.env,"
        " extract(epoch FROM l.run_at)::float8, extract(epoch FROM l.at)::float8"
        " FROM pgdrain_sim.ledger l JOIN pgdrain.jobs j ON j.id = l.job_id"
        " ORDER BY l.job_id, l.attempt, l.id"
    ).fetchall()
    ended: set[tuple[int, int]] = set()
    starts: dict[tuple[int, int], tuple[str, str, float, float]] = {}
    for job_id, queue, attempt, phase, env, run_at, at in rows:
        key = (int(job_id), int(attempt))
        if phase == "start":
            starts.setdefault(key, (str(queue), str(env), float(run_at), float(at)))
        else:
            ended.add(key)
    attempts = []
    for (job_id, attempt), (queue, _env, run_at, at) in starts.items():
        due = run_at
        previous = starts.get((job_id, attempt - 1))
        if previous is not None and (job_id, attempt - 1) not in ended:
            killed_at = kills.get(previous[1])
            if killed_at is not None:
                due = killed_at  # the lease ended with the run: due again from then
        attempts.append(
            Attempt(job_id, queue, attempt, scale.since_origin(due), scale.since_origin(at))
        )
    return attempts


def job_figures(
    conn: psycopg.Connection[Any], scale: Scale, queue: str | None = None
) -> tuple[float | None, int, int]:
    """The makespan (simulated seconds) of one queue's jobs or all; lost and double completions
    of all jobs."""
    row = conn.execute(
        "SELECT extract(epoch FROM min(created_at))::float8,"
        " extract(epoch FROM max(finished_at) FILTER (WHERE status = 'done'))::float8"
        " FROM pgdrain.jobs WHERE %(queue)s::text IS NULL OR queue = %(queue)s",
        {"queue": queue},
    ).fetchone()
    assert row is not None
    first, last = row
    counted = conn.execute("SELECT count(*) FROM pgdrain.jobs WHERE status <> 'done'").fetchone()
    assert counted is not None
    lost = counted[0]
    makespan = None if first is None or last is None else (last - first) * scale.factor
    double = conn.execute(
        "SELECT count(*) FROM (SELECT l.job_id FROM pgdrain_sim.ledger l"
        " JOIN pgdrain.jobs j ON j.id = l.job_id"
        " WHERE l.phase = 'done' GROUP BY l.job_id HAVING count(*) > 1) d"
    ).fetchone()
    assert double is not None
    return makespan, int(lost), int(double[0])


def figures(
    *,
    trace: str,
    system: str,
    conn: psycopg.Connection[Any],
    scale: Scale,
    samples: Sequence[tuple[float, int]],
    kills: Mapping[str, float],
    invocations: int,
    peak_runs: int,
    queue: str | None = None,
) -> Figures:
    active = [scale.since_origin(t) for t, n in samples if n > 0]
    logged = conn.execute("SELECT extract(epoch FROM at)::float8 FROM pgdrain_sim.activity")
    active += [scale.since_origin(float(t)) for (t,) in logged.fetchall()]
    everything = read_attempts(conn, scale, kills)
    attempts = [a for a in everything if queue is None or a.queue == queue]
    delays = [max(0.0, a.started - a.due) for a in attempts]
    makespan, lost, double = job_figures(conn, scale, queue)
    return Figures(
        trace=trace,
        system=system,
        awake_minutes=round(awake_seconds(active) / 60, 1),
        ideal_awake_minutes=round(awake_seconds(a.due for a in everything) / 60, 1),
        invocations=invocations,
        peak_runs=peak_runs,
        peak_connections=max((n for _, n in samples), default=0),
        p50_delay_s=_round(percentile(delays, 0.50)),
        p99_delay_s=_round(percentile(delays, 0.99)),
        max_delay_s=_round(max(delays, default=None)),
        makespan_s=_round(makespan),
        lost=lost,
        double_completions=double,
        extra={
            "attempts": len(attempts),
            "kills": len(kills),
            "enqueue_span_s": _round(_enqueue_span(conn, scale)),
        },
    )


def _enqueue_span(conn: psycopg.Connection[Any], scale: Scale) -> float | None:
    """Simulated seconds from the first job's creation to the last one's."""
    row = conn.execute(
        "SELECT extract(epoch FROM max(created_at) - min(created_at))::float8 FROM pgdrain.jobs"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0]) * scale.factor


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
