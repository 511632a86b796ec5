"""The statements of the control plane: kicks, the runs table, wake-ups, per-queue limits, the
backlog a run leaves, and retention (sql/control_plane.sql)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg

from pgdrain.db.sql import query
from pgdrain.db.store.common import (
    Connection,
    Statement,
    one_statement,
    queue_names,
)


class RetentionBatch(NamedTuple):
    """What one retention batch deleted."""

    done: int  # done jobs
    failed: int  # failed and cancelled jobs
    runs: int = 0  # lines of pgdrain.run_history
    due: bool = False  # partition housekeeping (or moving history) is due


@one_statement
def job_retention_batch(
    conn: Connection,
    done_days: float,
    failed_days: float,
    done_limit: int,
    failed_limit: int,
    runs_limit: int = 0,
) -> RetentionBatch:
    """Delete one batch of done jobs older than done_days, one of failed and cancelled jobs
    older than failed_days, and one of run history lines older than done_days (failed_days when
    done_days is 0: done jobs not kept), in one
    statement; returns how many of each, and whether partition housekeeping is due
    (pgdrain.db.retention)."""
    return job_retention_batch_statement(
        done_days, failed_days, done_limit, failed_limit, runs_limit
    ).run(conn)


def finished_jobs_partition_limits(
    conn: Connection, lock_timeout_ms: int, statement_timeout_ms: int
) -> None:
    """Limit the transaction's lock waits and statements (retention's partition step)."""
    conn.execute(
        query("finished_jobs_partition_limits"),
        {"lock_timeout_ms": lock_timeout_ms, "statement_timeout_ms": statement_timeout_ms},
    )


@one_statement
def finished_jobs_partition_keep(conn: Connection, done_days: float | None) -> tuple[int, int]:
    """Make the day partitions of done jobs ahead (today and the next two days) and drop those
    past done_days (None: none); returns how many were made and dropped."""
    row = conn.execute(query("finished_jobs_partition_keep"), {"done_days": done_days}).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@one_statement
def job_history_move(conn: Connection, limit: int) -> int:
    """Move up to `limit` finished rows left in active_jobs (by migration 0018) to
    finished_jobs; returns how many."""
    row = conn.execute(query("job_history_move"), {"limit": limit}).fetchone()
    assert row is not None
    return int(row[0])


def job_retention_batch_statement(
    done_days: float, failed_days: float, done_limit: int, failed_limit: int, runs_limit: int = 0
) -> Statement[RetentionBatch]:
    params = {
        "done_days": done_days,
        "failed_days": failed_days,
        "done_limit": done_limit,
        "failed_limit": failed_limit,
        "runs_limit": runs_limit,
    }

    def deleted_counts(cur: psycopg.Cursor[Any]) -> RetentionBatch:
        row = cur.fetchone()
        assert row is not None  # one row: three counts and a flag
        return RetentionBatch(int(row[0]), int(row[1]), int(row[2]), bool(row[3]))

    return Statement(query("job_retention_batch"), params, deleted_counts)


@dataclass(frozen=True)
class QueueDepth:
    """How many jobs are ready in some queues, and how long the oldest has waited."""

    ready: int
    oldest_ready_age_s: float


@one_statement
def queue_depth(conn: Connection, queues: Sequence[str] | None) -> QueueDepth:
    """How many jobs are ready in these queues (None: every queue), and how long the oldest
    has waited."""
    row = conn.execute(query("queue_depth"), {"queues": queue_names(queues)}).fetchone()
    if row is None:
        return QueueDepth(0, 0.0)
    return QueueDepth(ready=int(row[0]), oldest_ready_age_s=float(row[1]))


def queue_depth_held_statement(queues: Sequence[str] | None) -> Statement[QueueDepth]:
    """How many jobs are ready in those of these queues that are at their concurrency limit,
    and how long the oldest has waited (sent with a run's exit check)."""

    def depth(cur: psycopg.Cursor[Any]) -> QueueDepth:
        row = cur.fetchone()
        assert row is not None  # an aggregate: one row
        return QueueDepth(ready=int(row[0]), oldest_ready_age_s=float(row[1]))

    return Statement(query("queue_depth_held"), {"queues": queue_names(queues)}, depth)


@dataclass(frozen=True)
class KickDecision:
    """What a kick does per queue: invoke a run now (`invoke`), or ask for a wake-up when its
    next job is due (`later`: nothing is ready, no live run drains it, and no wake-up pending
    for it comes early enough)."""

    invoke: list[str]
    later: dict[str, dt.datetime]
    paused: list[str] = field(default_factory=list)  # recorded; no run while they are paused


def kick_debounce(
    conn: Connection,
    queues: Sequence[str],
    window_seconds: float,
    precision_seconds: float = 60.0,
    hold_seconds: float = 0.0,
) -> KickDecision:
    """Record a kick for each queue. The queues to invoke for (they need a run, their last
    invoke is older than the window and no live run holds them) are now marked as invoked and
    held for hold_seconds. precision_seconds is the wake-up rounding
    (PGDRAIN_WAKE_PRECISION_SECONDS)."""
    rows = conn.execute(
        query("kick_debounce"),
        {
            "queues": list(queues),
            "window_seconds": window_seconds,
            "precision_seconds": precision_seconds,
            "hold_seconds": hold_seconds,
        },
    ).fetchall()
    return KickDecision(
        invoke=sorted(str(r[0]) for r in rows if r[1]),
        later={str(r[0]): r[2] for r in rows if not r[1] and r[2] is not None},
        paused=sorted(str(r[0]) for r in rows if r[3]),
    )


@one_statement
def kick_clear(conn: Connection, queues: Sequence[str]) -> None:
    """Forget the last invoke of these queues (it failed): the next kick invokes."""
    conn.execute(query("kick_clear"), {"queues": list(queues)})


# -- the control plane: runs, fan-out, exit, wake-ups (pgdrain.aws) -------------------------


@one_statement
def queue_ready_count(conn: Connection, queues: Sequence[str] | None, limit: int) -> int:
    """Ready jobs in these queues (None: every queue) that runs may claim now (not a paused
    queue's, nor more of a rate-limited queue's than its window has left), counted up to
    `limit`."""
    row = conn.execute(
        query("queue_ready_count"), {"queues": queue_names(queues), "limit": limit}
    ).fetchone()
    return 0 if row is None else int(row[0])


@one_statement
def queue_ready_elsewhere(
    conn: Connection, queues: Sequence[str], limit: int
) -> list[tuple[str, int]]:
    """The queues outside `queues` with ready jobs, and how many, each counted up to `limit`:
    what a run restricted to `queues` leaves unserved."""
    rows = conn.execute(
        query("queue_ready_elsewhere"), {"queues": list(queues), "limit": limit}
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


@one_statement
def run_register(
    conn: Connection,
    run_id: str,
    queues: Sequence[str] | None,
    chain: int,
    remaining_seconds: float,
    hold_seconds: float = 0.0,
) -> None:
    """Count this run as live until its deadline (now + remaining_seconds, database clock), and
    hold its queues' kicks for hold_seconds (never past the deadline)."""
    conn.execute(
        query("run_register"),
        {
            "run_id": run_id,
            "queues": queue_names(queues),
            "chain": chain,
            "remaining_seconds": remaining_seconds,
            "hold_seconds": hold_seconds,
        },
    )


@one_statement
def kick_hold(conn: Connection, queues: Sequence[str] | None, hold_seconds: float) -> None:
    """Renew this run's hold on its queues' kicks (None: every queue's) until now +
    hold_seconds."""
    conn.execute(query("kick_hold"), {"queues": queue_names(queues), "hold_seconds": hold_seconds})


def run_gate_lock(conn: Connection) -> None:
    """Hold the fan-out gate until the transaction ends."""
    conn.execute(query("run_gate_lock"))


def run_spawn(
    conn: Connection,
    spawn_id: str,
    queues: Sequence[str] | None,
    chain: int,
    runs_needed: int,
    max_runs: int,
    reserve_seconds: float,
) -> list[str]:
    """Reserve new runs until `runs_needed` are live, never more than `max_runs`; returns the
    reserved run ids. Decisions serialise on the gate, so concurrent spawners keep the cap.
    Sent again with the same `spawn_id` (after a lost reply), it returns what it reserved."""
    with conn.transaction():
        run_gate_lock(conn)
        rows = conn.execute(
            query("run_spawn"),
            {
                "spawn_id": spawn_id,
                "queues": queue_names(queues),
                "chain": chain,
                "runs_needed": runs_needed,
                "max_runs": max_runs,
                "reserve_seconds": reserve_seconds,
            },
        ).fetchall()
    return [str(r[0]) for r in rows]


def run_admit(
    conn: Connection,
    run_id: str,
    reserved: str,
    queues: Sequence[str],
    chain: int,
    remaining_seconds: float,
    max_runs: int,
    hold_seconds: float = 0.0,
) -> bool:
    """A fan-out run registers as run_id if it may drain: it takes up the reservation
    `reserved` once, or else finds fewer than max_runs live runs. Under the gate, as spawns
    are, so the cap holds however many copies of its event arrive."""
    with conn.transaction():
        run_gate_lock(conn)
        row = conn.execute(
            query("run_admit"), {"run_id": run_id, "reserved": reserved, "max_runs": max_runs}
        ).fetchone()
        admitted = row is not None and bool(row[0])
        if admitted:
            run_register(conn, run_id, queues, chain, remaining_seconds, hold_seconds)
    return admitted


@one_statement
def run_unregister(conn: Connection, run_id: str) -> None:
    conn.execute(query("run_unregister"), {"run_id": run_id})


@dataclass(frozen=True)
class ExitCheck:
    """What a run finds as it unregisters: whether it may exit, or must claim again."""

    kicked: bool  # a kick arrived that this run's last claim may not have seen
    ready: bool  # a job is ready now
    due_at: dt.datetime | None  # when new work is next due in these queues
    kick_age_s: float | None = None  # seconds since the latest kick of these queues
    exited: bool = True  # the run unregistered (and cleared its queues' kick window)
    due_in_s: float | None = None  # seconds from the check to due_at, on the database's clock


# The counts a run's history line keeps, as its summary names them (runner/summary.py).
RUN_RECORD_COUNTS = (
    "claimed",
    "done",
    "retried",
    "failed",
    "cancelled",
    "lease_lost",
    "reclaimed",
    "released",
)


@dataclass(frozen=True)
class RunRecord:
    """What an exiting run writes to pgdrain.run_history (run_exit): why it started, how long
    it ran, what it did and why it stopped."""

    trigger: str  # the event's reason (pgdrain.aws.events)
    chain: int
    elapsed_s: float  # since the run started, by its own clock
    stop_reason: str
    counts: Mapping[str, int]  # RUN_RECORD_COUNTS; a count not given is 0
    drained_again: int = 0
    lingered: int = 0
    continued: bool = False
    done_kept: bool = True  # False: its done jobs deleted (Settings.keeps_done)

    def params(self) -> dict[str, Any]:
        return {
            "record": True,
            "trigger": self.trigger,
            "chain": self.chain,
            "elapsed_s": self.elapsed_s,
            "stop_reason": self.stop_reason,
            **{name: int(self.counts.get(name, 0)) for name in RUN_RECORD_COUNTS},
            "drained_again": self.drained_again,
            "lingered": self.lingered,
            "continued": self.continued,
            "done_kept": self.done_kept,
        }


# run_exit's history parameters when it writes none: every one a record has, NULL.
_NO_RECORD: dict[str, Any] = {
    **dict.fromkeys(RunRecord("", 0, 0.0, "", {}).params()),
    "record": False,
}


@one_statement
def run_exit(
    conn: Connection,
    run_id: str,
    queues: Sequence[str] | None,
    *,
    may_stay: bool = False,
    linger_window_s: float = 0.0,
    clear_kicks: bool = True,
    record: RunRecord | None = None,
) -> ExitCheck:
    """The run exits, unless (may_stay) a kick or a ready job came after its last claim, or
    its queues' latest kick is younger than linger_window_s; the check says which, and when
    work is next due. Exiting, it writes `record` to the run history (once per run_id)."""
    row = conn.execute(
        query("run_exit"),
        {
            "run_id": run_id,
            "queues": queue_names(queues),
            "may_stay": may_stay,
            "linger_window_s": linger_window_s,
            "clear_kicks": clear_kicks,
            **(_NO_RECORD if record is None else record.params()),
        },
    ).fetchone()
    assert row is not None  # one row, from the one-row CTEs
    return ExitCheck(
        kicked=bool(row[0]),
        kick_age_s=row[1],
        ready=bool(row[2]),
        due_at=row[3],
        exited=bool(row[4]),
        due_in_s=row[5],
    )


# How long a run waits for the lock under which a new limit's row is created: every
# statement that moves jobs waits behind that lock while it is asked for (queue_limit_sync).
QUEUE_LIMIT_CREATE_WAIT_MS = 2000


@one_statement
def queue_limit_sync(
    conn: Connection,
    queues: Sequence[str] | None,
    limits: Sequence[tuple[str, int]],
    rates: Sequence[tuple[str, int, int]] = (),
) -> None:
    """Make the limits of `queues` in pgdrain.queue_limits exactly `limits` (queue, max) and
    `rates` (queue, starts, period seconds); a new row starts from an exact count of the
    queue's running jobs. A paused queue stays paused."""
    running = dict(limits)
    per_period = {q: (n, seconds) for q, n, seconds in rates}
    limited = sorted({*running, *per_period})
    conn.execute(
        query("queue_limit_sync"),
        {
            "queues": queue_names(queues),
            "limited": limited,
            "limits": [running.get(q) for q in limited],
            "rates": [per_period[q][0] if q in per_period else None for q in limited],
            "periods": [per_period[q][1] if q in per_period else None for q in limited],
            "wait_ms": QUEUE_LIMIT_CREATE_WAIT_MS,
        },
    )


@dataclass(frozen=True)
class Recounted:
    """A limit row whose running count had drifted, corrected by queue_limit_recount."""

    queue: str
    was: int  # the count the row had
    running: int  # the queue's running jobs, counted


def queue_limit_recount_statement(
    queues: Sequence[str] | None,
) -> Statement[list[Recounted]]:
    """Recount the limits of those of `queues` that are full while a job of theirs is ready;
    reads the rows it corrected (sent with a run's first claim and its exit check)."""

    def corrected(cur: psycopg.Cursor[Any]) -> list[Recounted]:
        return [Recounted(str(r[0]), int(r[1]), int(r[2])) for r in cur.fetchall()]

    return Statement(query("queue_limit_recount"), {"queues": queue_names(queues)}, corrected)


class Replaced(NamedTuple):
    """A wake-up a reservation replaced: put back if the new one's schedule cannot be made."""

    wake_at: dt.datetime
    state: str
    reserved_by: str
    reserved_until: dt.datetime


class WakeReserved(NamedTuple):
    """A reservation made: the caller creates the schedule."""

    wake_at: dt.datetime
    replaced: Replaced | None


@one_statement
def wake_reserve(
    conn: Connection, queue_set: str, wake_at: dt.datetime, run_id: str, hold_seconds: float
) -> WakeReserved | None:
    """The reservation when the caller must create the schedule for `wake_at` (no earlier or
    equal wake-up of these queues is pending), with the wake-up it replaced; it holds for
    hold_seconds. None: a wake-up is pending."""
    row = conn.execute(
        query("wake_reserve"),
        {
            "queue_set": queue_set,
            "wake_at": wake_at,
            "run_id": run_id,
            "hold_seconds": hold_seconds,
        },
    ).fetchone()
    if row is None:
        return None
    replaced = None if row[1] is None else Replaced(row[1], row[2], row[3], row[4])
    return WakeReserved(row[0], replaced)


@one_statement
def wake_confirm(
    conn: Connection, queue_set: str, wake_at: dt.datetime, run_id: str, horizon_seconds: float
) -> bool:
    """Whether the database holds this wake-up, reserved by `run_id` and due within
    horizon_seconds (a wake-up request's check); if so it is now created."""
    row = conn.execute(
        query("wake_confirm"),
        {
            "queue_set": queue_set,
            "wake_at": wake_at,
            "run_id": run_id,
            "horizon_seconds": horizon_seconds,
        },
    ).fetchone()
    return row is not None


@one_statement
def wake_created(conn: Connection, queue_set: str, wake_at: dt.datetime, run_id: str) -> None:
    conn.execute(
        query("wake_created"), {"queue_set": queue_set, "wake_at": wake_at, "run_id": run_id}
    )


@one_statement
def wake_release(
    conn: Connection,
    queue_set: str,
    wake_at: dt.datetime,
    run_id: str,
    replaced: Replaced | None = None,
) -> None:
    """Drop `run_id`'s reservation, or put back the wake-up it replaced."""
    conn.execute(
        query("wake_release"),
        {
            "queue_set": queue_set,
            "wake_at": wake_at,
            "run_id": run_id,
            "replaced_wake_at": replaced.wake_at if replaced else None,
            "replaced_state": replaced.state if replaced else None,
            "replaced_reserved_by": replaced.reserved_by if replaced else None,
            "replaced_reserved_until": replaced.reserved_until if replaced else None,
        },
    )
