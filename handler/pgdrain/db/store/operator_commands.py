"""The statements behind the operator commands: stats, jobs, jobs show, retry, cancel, purge,
and the migration ledger (sql/operator_commands.sql)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from pgdrain.db.sql import Migration, query
from pgdrain.db.store.common import (
    FINISHED,
    Connection,
    FinishedStatus,
    Status,
)
from pgdrain.errors import DatabaseMisconfigured, PgdrainError

# What an operator read (jobs, jobs show, job_state, the dashboard) decodes of the JSON a job
# or plain SQL wrote: no deeper than pgdrain accepts (api.jsonbound.MAX_DEPTH), so that
# json.loads, and every later json.dumps, stays inside Python's recursion limit.
READ_MAX_DEPTH = 64
# The values read as text and decoded one by one: one that cannot be leaves the rest readable.
JSON_FIELDS = ("payload", "output", "progress", "errors")

# queue_stats counts done, failed, parked and cancelled jobs up to this many per queue.
STATS_HISTORY_BOUND = 10_000
# The unique index that holds an idempotency key for the queued, running or parked job with it.
ACTIVE_KEY_INDEX = "jobs_active_key_idx"


@dataclass(frozen=True)
class QueueStats:
    """One queue's counts by status (`pgdrain stats`)."""

    queue: str
    queued: int  # ready + delayed
    ready: int
    delayed: int  # queued with run_at in the future (a delay, a retry's backoff)
    running: int
    done: int
    failed: int
    parked: int
    cancelled: int
    oldest_ready_age_s: float
    expired_leases: int
    paused: bool = False  # pgdrain.pause_queue: no run claims its jobs until it is resumed
    waiting: int = 0  # held back by a sequence or by dependencies (migration 0021)


@dataclass(frozen=True)
class JobRow:
    """One job as `pgdrain jobs` lists it."""

    id: int
    queue: str
    kind: str
    status: Status
    priority: int
    attempts: int
    max_attempts: int
    reclaim_count: int
    # None: a finished row's run_at no client can read (written before migration 0025).
    run_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    last_error: str | None
    due_in_s: float | None  # until run_at, on the database's clock
    sequence: str | None = None
    depends_on: list[int] | None = None
    progress: Any = None  # what the job recorded (JSON), if anything
    output: Any = None
    # {field: why} for a value Python cannot hold, given as its JSON text (decode_stored).
    undecoded: dict[str, str] | None = None

    @property
    def state(self) -> str:
        """The status, with a queued job told apart: ready (run_at has come), retrying
        (waiting out a backoff after a failed attempt) or scheduled (enqueued for later)."""
        if self.status != "queued":
            return self.status
        if self.due_in_s is None or self.due_in_s <= 0:
            return "ready"
        return "retrying" if self.attempts > 0 else "scheduled"


@dataclass(frozen=True)
class Retry:
    """A job a retry found failed, parked or cancelled (by filter: failed or parked): queued
    again, or not, and why."""

    id: int
    queue: str
    kind: str
    retried: bool
    # Not retried: the job that holds its idempotency key (it does the work). None with
    # retried False and no dependency: the job changed state while the retry ran (another
    # operator's action).
    held_by: int | None
    # Not retried (a cancelled job): a job it depends on that failed or was cancelled, or that
    # is no longer kept (dependency_status None). Queued again, it would never run.
    dependency: int | None = None
    dependency_status: str | None = None
    # Retried, cancelled while it ran: queued for when that attempt's lease ends, its code
    # possibly still running until then (migration 0033). None: ready now.
    lease_wait_until: dt.datetime | None = None

    def why_not(self) -> str:
        """Why it was not retried, for a person: "" when it was, or when it changed state."""
        if self.dependency is not None:
            ended = {"failed": "failed", "cancelled": "was cancelled"}
            return f"job {self.dependency}, which it depends on, " + ended.get(
                self.dependency_status or "", "is no longer kept"
            )
        if self.held_by is not None:
            return f"key held by job {self.held_by}"
        return ""


# How many times a retry runs again after a concurrent transaction took a key it was about to
# take: each try that fails sees one more holder, so more than a few means keys churn as fast
# as they are read.
RETRY_TRIES = 10


class RetryContended(PgdrainError):
    """A retry met a concurrent transaction taking its jobs' keys at every try. Nothing was
    changed; running it again is safe."""


def job_retry(conn: Connection, ids: Sequence[int]) -> list[Retry]:
    """Queue again these failed, parked or cancelled jobs, except those whose idempotency key
    another job holds; one Retry per job that was in one of those states, by id. Runs in the
    caller's transaction (in a savepoint), which must be READ COMMITTED, or in its own."""
    return _retried(conn, lambda: conn.execute(query("job_retry"), {"ids": list(ids)}).fetchall())


def job_cancel_mark(conn: Connection, on: bool) -> None:
    """In the caller's transaction: whether a running job a statement cancels keeps its slot
    of its queue's limit until its lease ends (migration 0040)."""
    conn.execute(query("job_cancel_mark"), {"value": "on" if on else ""})


def job_retry_mark(conn: Connection, on: bool) -> None:
    """In the caller's transaction: whether what a statement puts back into active_jobs is
    queued again by a retry, not enqueued (migration 0029)."""
    conn.execute(query("job_retry_mark"), {"value": "on" if on else ""})


def _retried(conn: Connection, attempt: Callable[[], list[tuple[Any, ...]]]) -> list[Retry]:
    """Run a retry statement until no concurrent transaction took a key it was taking."""
    for _ in range(RETRY_TRIES):
        try:
            with conn.transaction():  # a savepoint in the caller's transaction: undone whole
                # What the statement puts back is queued again: a dependency retention has
                # deleted since does not refuse it (the statement judged the dependencies).
                job_retry_mark(conn, True)
                rows = attempt()
                job_retry_mark(conn, False)
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != ACTIVE_KEY_INDEX:
                raise
            # A key this try was taking was taken by a transaction that committed after the
            # try's snapshot (an enqueue, another retry). Safe to run again: the savepoint
            # undid this try, and the next one reads a new snapshot, which sees that holder.
            continue
        except psycopg.errors.DeadlockDetected:
            # Two retries took two keys in opposite orders; the other one goes on. Safe to
            # run again, as above.
            continue
        return [
            Retry(int(r[0]), str(r[1]), str(r[2]), bool(r[4]), r[3], r[5], r[6], r[7]) for r in rows
        ]
    raise RetryContended(
        f"retry gave up after {RETRY_TRIES} tries: concurrent transactions kept taking the "
        "idempotency keys of the jobs it was retrying; nothing was changed, run it again"
    )


def job_purge_finished(
    conn: Connection,
    older_than_days: float,
    batch: int = 5000,
    *,
    statuses: Sequence[FinishedStatus] = FINISHED,
    queue: str | None = None,
) -> int:
    """Delete one batch of at most `batch` finished jobs older than `older_than_days`;
    returns how many. Callers loop until a batch comes back short (pgdrain.db.retention)."""
    cur = conn.execute(
        query("job_purge_finished"),
        {"days": older_than_days, "limit": batch, "statuses": list(statuses), "queue": queue},
    )
    row = cur.fetchone()
    assert row is not None  # one row: the count
    return int(row[0])


def finished_jobs_days_lock(conn: Connection, lock_timeout_ms: int) -> None:
    """In the caller's transaction: the partition functions' lock, and lock waits limited to
    `lock_timeout_ms` (0: none) until the transaction ends."""
    conn.execute(query("finished_jobs_days_lock"), {"lock_timeout_ms": lock_timeout_ms})


def finished_jobs_days_count(conn: Connection, older_than_days: float) -> int:
    """How many done jobs finished_jobs_days_drop would take."""
    row = conn.execute(query("finished_jobs_days_count"), {"days": older_than_days}).fetchone()
    assert row is not None  # one row: the count
    return int(row[0])


def finished_jobs_days_drop(conn: Connection, older_than_days: float) -> int:
    """Drop the day partitions whose whole day ended more than `older_than_days` ago; how many."""
    row = conn.execute(query("finished_jobs_days_drop"), {"days": older_than_days}).fetchone()
    assert row is not None  # one row: the count
    return int(row[0])


def queue_stats(conn: Connection) -> list[QueueStats]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("queue_stats")).fetchall()
    return [QueueStats(**row) for row in rows]


def job_list(
    conn: Connection,
    statuses: Sequence[str],
    limit: int,
    *,
    queue: str | None = None,
    kind: str | None = None,
    since: dt.datetime | None = None,
    before: int | None = None,
    values: bool = True,
) -> list[JobRow]:
    """The newest `limit` jobs matching the filters (None matches every job), older than the
    job `before` when given (the next page). One status of finished rows, in a queue or all,
    is read through their index (job_list_finished). `values`: read each job's progress and
    output too (else both None)."""
    statuses = list(statuses)
    if len(statuses) == 1 and statuses[0] in FINISHED_LISTED and kind is None and since is None:
        return job_list_finished(
            conn, statuses[0], limit, queue=queue, before=before, values=values
        )
    params = {
        "statuses": statuses,
        "limit": limit,
        "queue": queue,
        "kind": kind,
        "since": since,
        "before": before,
        "values": values,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("job_list"), params).fetchall()
    return [JobRow(**_decoded(row, ("progress", "output"))) for row in rows]


# The statuses of jobs_finished_queue_idx: a list of one of them is read from it.
FINISHED_LISTED = ("done", "failed", "parked", "cancelled")


def job_list_finished(
    conn: Connection,
    status: str,
    limit: int,
    *,
    queue: str | None = None,
    before: int | None = None,
    values: bool = True,
) -> list[JobRow]:
    """job_list's answer for one status of FINISHED_LISTED, without kind or since."""
    params = {"status": status, "limit": limit, "queue": queue, "before": before, "values": values}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("job_list_finished"), params).fetchall()
    return [JobRow(**_decoded(row, ("progress", "output"))) for row in rows]


def decode_stored(text: str | None) -> tuple[Any, str | None]:
    """A stored JSON value's text, decoded: (value, None). One Python cannot hold (nested
    deeper than READ_MAX_DEPTH, an integer past its int-string limit), written by plain SQL:
    (its JSON text, why), so an operator's read shows it instead of raising."""
    if text is None:
        return None, None
    deep = f"nests deeper than {READ_MAX_DEPTH} levels"
    try:
        value = json.loads(text)
    except RecursionError:
        return text, deep
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        return text, f"cannot be read in Python: {str(exc).split(';')[0]}"
    # Deeper than the limit yet decoded: shown as text too (json.dumps would recurse as deep).
    if text.count("[") + text.count("{") > READ_MAX_DEPTH and _depth(value) > READ_MAX_DEPTH:
        return text, deep
    return value, None


def _depth(value: Any) -> int:
    """How deep lists and dicts nest, walked without recursion, up to READ_MAX_DEPTH + 1."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and deepest <= READ_MAX_DEPTH:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest


def _decoded(row: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """The row with these fields (JSON text) decoded, and `undecoded` naming those that
    could not be, with why; without `undecoded` when all were."""
    undecoded = {}
    for field in fields:
        row[field], why = decode_stored(row[field])
        if why is not None:
            undecoded[field] = why
    if undecoded:
        row["undecoded"] = undecoded
    return row


# -- migrations: run by pgdrain.db.migrate inside one transaction ------------------------------


def lock_timeout(conn: Connection, timeout_ms: int) -> None:
    """Wait at most this long for any lock, until the transaction ends."""
    conn.execute(query("lock_timeout"), {"timeout": f"{timeout_ms}ms"})


def migration_lock(conn: Connection) -> None:
    """Serialise concurrent migrations until the transaction ends (pooler-safe: xact lock)."""
    conn.execute(query("migration_lock"))


@dataclass(frozen=True)
class LockHolder:
    """A session in the way of a migration (`pgdrain migrate` names it when it gives up waiting)."""

    pid: int
    role: str
    application: str


def migration_lock_holders(conn: Connection) -> list[LockHolder]:
    rows = conn.execute(query("migration_lock_holders")).fetchall()
    return [LockHolder(int(r[0]), str(r[1]), str(r[2])) for r in rows]


def migration_ledger_exists(conn: Connection) -> bool:
    row = conn.execute(query("migration_ledger_exists")).fetchone()
    return bool(row and row[0])


def migration_applied(conn: Connection) -> set[str]:
    """The versions applied so far; none before the ledger exists."""
    if not migration_ledger_exists(conn):
        return set()
    return {str(r[0]) for r in conn.execute(query("migration_applied")).fetchall()}


def migration_record(conn: Connection, migration: Migration) -> None:
    """Apply one migration file (our own packaged DDL, never input) and record it."""
    conn.execute(migration.sql)
    conn.execute(query("migration_record"), {"version": migration.version})


# -- operator actions (pgdrain jobs show / retry / cancel / purge) ---------------------------


def job_dependency_outputs(conn: Connection, job_id: int) -> dict[int, Any]:
    """Each dependency of the job: the output it recorded (None: none, not done, or its row
    deleted by retention or purge). Every id the job depends on is a key."""
    rows = conn.execute(query("job_dependency_outputs"), {"id": job_id}).fetchall()
    return {int(r[0]): r[2] for r in rows}


def job_show(conn: Connection, job_id: int) -> dict[str, Any] | None:
    """Every column of one job (JSON types: timestamps as ISO text), or None if unknown. A
    value Python cannot hold is given as its JSON text, and `undecoded` says which and why."""
    row = conn.execute(query("job_show"), {"id": job_id}).fetchone()
    if row is None:
        return None
    # A field is NULL only when there is no such column (a value's JSON null is "null").
    texts = {f: text for f, text in zip(JSON_FIELDS, row[1:], strict=True) if text is not None}
    return _decoded(row[0] | texts, list(texts))


def job_retry_matching(
    conn: Connection,
    statuses: Sequence[Literal["failed", "parked"]],
    *,
    queue: str | None = None,
    kind: str | None = None,
    since: dt.datetime | None = None,
) -> list[Retry]:
    """Queue again every failed/parked job matching the filters (None matches all), except
    those whose idempotency key another job holds: as job_retry, by filter."""
    params = {"statuses": list(statuses), "queue": queue, "kind": kind, "since": since}
    return _retried(conn, lambda: conn.execute(query("job_retry_matching"), params).fetchall())


@dataclass(frozen=True)
class RetryPreview:
    """What a retry by filter would do: how many jobs it would queue again, how many it would
    not as another job holds their key, and the first of each (`shown` at most, by id)."""

    would_retry: int
    key_held: int
    first: list[Retry]


def job_retry_matching_preview(
    conn: Connection,
    statuses: Sequence[Literal["failed", "parked"]],
    *,
    queue: str | None = None,
    kind: str | None = None,
    since: dt.datetime | None = None,
    shown: int = 100,
) -> RetryPreview:
    """job_retry_matching's outcome, read without changing a job: its counts and a first page."""
    params = {
        "statuses": list(statuses),
        "queue": queue,
        "kind": kind,
        "since": since,
        "shown": shown,
    }
    rows = conn.execute(query("job_retry_matching_preview"), params).fetchall()
    first = [
        Retry(int(r[0]), str(r[1]), str(r[2]), bool(r[4]), r[3], r[5], r[6], r[7]) for r in rows
    ]
    would_retry, key_held = (int(rows[0][8]), int(rows[0][9])) if rows else (0, 0)
    return RetryPreview(would_retry, key_held, first)


@dataclass(frozen=True)
class Cancelled:
    """A job an operator cancelled, and the status it had."""

    id: int
    was: Literal["queued", "running", "parked"]


def job_cancel(conn: Connection, ids: Sequence[int]) -> list[Cancelled]:
    """Cancel these jobs; those already finished (or unknown) are not returned. Runs in the
    caller's transaction (in a savepoint), which must be READ COMMITTED, or in its own."""
    rows = _cancelling(
        conn, lambda: conn.execute(query("job_cancel"), {"ids": list(ids)}).fetchall()
    )
    return sorted((Cancelled(int(r[0]), r[1]) for r in rows), key=lambda c: c.id)


# How many times a cancel runs again after a job it locked had changed since its snapshot.
# The second try holds the first one's locks, so only a job newly matched (by filter, or one
# queued again by a retry meanwhile) can change again: more than a few means they churn.
CANCEL_TRIES = 10


class CancelContended(PgdrainError):
    """A cancel found jobs changing under it at every try. Nothing was changed; running it
    again is safe."""


def _cancelling(
    conn: Connection, attempt: Callable[[], list[tuple[Any, ...]]]
) -> list[tuple[Any, ...]]:
    """Run a cancel statement until every job it locked was cancelled; the cancelled rows.

    A job that changed between the statement's snapshot and its row lock (a claim took it, a
    failed attempt queued it again) is locked but not cancelled: the view writes a row only as
    the statement read it. Running the statement again in the same transaction is safe and
    cancels it: that transaction holds its lock, and the new statement's snapshot sees the row
    as it is now."""
    with conn.transaction():  # the first try's locks held for the next; undone whole on error
        # A running job cancelled keeps its slot of its queue's limit while its lease runs.
        job_cancel_mark(conn, True)
        cancelled: list[tuple[Any, ...]] = []
        for _ in range(CANCEL_TRIES):
            rows = attempt()
            cancelled += [r[:-1] for r in rows if r[-1]]
            if all(r[-1] for r in rows):
                job_cancel_mark(conn, False)
                return cancelled
        # Raised inside the block: what the tries cancelled is undone with it.
        raise CancelContended(
            f"cancel gave up after {CANCEL_TRIES} tries: the jobs it was cancelling kept "
            "changing under it (claimed, queued again); nothing was changed, run it again"
        )


@dataclass(frozen=True)
class CancelledMatch:
    """A job an operator action by filter cancelled (or, in a dry run, would), and the status
    it had."""

    id: int
    queue: str
    kind: str
    was: Literal["queued", "running", "parked"]


def job_cancel_matching(
    conn: Connection,
    statuses: Sequence[Literal["queued", "running", "parked", "waiting"]],
    *,
    queue: str | None = None,
    kind: str | None = None,
    since: dt.datetime | None = None,
) -> list[CancelledMatch]:
    """Cancel every job in `statuses` matching the filters (None matches all)."""
    params = {"statuses": list(statuses), "queue": queue, "kind": kind, "since": since}
    rows = _cancelling(conn, lambda: conn.execute(query("job_cancel_matching"), params).fetchall())
    return sorted(
        (CancelledMatch(int(r[0]), str(r[1]), str(r[2]), r[3]) for r in rows), key=lambda c: c.id
    )


def job_count_finished(
    conn: Connection,
    older_than_days: float,
    *,
    statuses: Sequence[FinishedStatus] = FINISHED,
    queue: str | None = None,
) -> int:
    """How many jobs job_purge_finished would delete, in all its batches."""
    params = {"days": older_than_days, "statuses": list(statuses), "queue": queue}
    row = conn.execute(query("job_count_finished"), params).fetchone()
    return 0 if row is None else int(row[0])


def job_queues(conn: Connection, ids: Sequence[int]) -> list[str]:
    """The queues of these jobs, sorted, each once."""
    rows = conn.execute(query("job_queues"), {"ids": list(ids)}).fetchall()
    return [str(r[0]) for r in rows]


# -- the dashboard's reads (pgdrain ui) -------------------------------------------------------

# job_finished_per_minute counts at most this many finished jobs per call.
THROUGHPUT_BOUND = 50_000
# The control-plane tables hold a row per live run, per set of queues, per queue: a page shows
# at most this many of each.
CONTROL_PLANE_ROWS = 200


def operator_session(conn: Connection) -> None:
    """On a new operator's connection: timestamps in the style psycopg reads. Refuses a
    session whose triggers do not fire (session_replication_role replica or local): a cancel
    or a retry through the view would say it was done and change nothing."""
    row = conn.execute(query("operator_session")).fetchone()
    assert row is not None  # one row
    if row[1] != "origin":
        setting = f"session_replication_role is {row[1]!r}"
        raise DatabaseMisconfigured(
            setting + " for this role or database: pgdrain's triggers (moving a cancelled or "
            "retried job, releasing dependents, counting a queue's running jobs) do not fire; "
            "reset it to 'origin' for the role or database"
        )


def operator_read_timeout(conn: Connection, timeout_ms: int) -> None:
    """Bound the current transaction's statements to `timeout_ms` (> 0)."""
    assert timeout_ms > 0, "a timeout of 0 disables the limit"
    conn.execute(query("operator_read_timeout"), {"timeout_ms": timeout_ms})


@dataclass(frozen=True)
class MinuteCount:
    """Jobs of one queue that finished within one minute."""

    minute: dt.datetime
    queue: str
    done: int
    failed: int
    cancelled: int


@dataclass(frozen=True)
class Throughput:
    """Finished jobs per minute since `since`. `counted_from` is where the counts are whole:
    `since`, or later when the bound stopped the count (the minutes before it are missing or
    partial)."""

    since: dt.datetime
    counted_from: dt.datetime
    minutes: list[MinuteCount]


def job_finished_per_minute(
    conn: Connection, since: dt.datetime, limit: int = THROUGHPUT_BOUND
) -> Throughput:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            query("job_finished_per_minute"), {"since": since, "limit": limit}
        ).fetchall()
    minutes = [MinuteCount(**row) for row in rows]
    counted = sum(m.done + m.failed + m.cancelled for m in minutes)
    counted_from = since
    if counted >= limit and minutes:
        # The oldest minute reached holds only part of its jobs: whole from the next one on.
        counted_from = minutes[0].minute + dt.timedelta(minutes=1)
    return Throughput(since=since, counted_from=counted_from, minutes=minutes)


@dataclass(frozen=True)
class RunRow:
    """A run in pgdrain.runs: registered, or reserved by the run that spawned it."""

    run_id: str
    queues: list[str]
    chain: int
    started_at: dt.datetime
    deadline: dt.datetime
    live: bool
    age_s: float


def run_list(conn: Connection, limit: int = CONTROL_PLANE_ROWS) -> list[RunRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("run_list"), {"limit": limit}).fetchall()
    return [RunRow(**row) for row in rows]


# How many ended runs the control page and `pgdrain runs` show by default.
RUN_HISTORY_ROWS = 50


@dataclass(frozen=True)
class RunHistoryRow:
    """A run that ended (pgdrain.run_history): its trigger, when and how long, what it did."""

    run_id: str
    trigger: str
    queues: list[str]
    chain: int
    started_at: dt.datetime
    finished_at: dt.datetime
    duration_s: float
    stop_reason: str
    claimed: int
    done: int
    retried: int
    failed: int
    cancelled: int
    lease_lost: int
    reclaimed: int
    released: int
    drained_again: int
    lingered: int
    continued: bool


def run_history_list(conn: Connection, limit: int = RUN_HISTORY_ROWS) -> list[RunHistoryRow]:
    """The runs that ended, newest first (`pgdrain runs`, the dashboard's control page)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("run_history_list"), {"limit": limit}).fetchall()
    return [RunHistoryRow(**row) for row in rows]


def runs_keep_done(conn: Connection) -> bool | None:
    """Whether the function's runs keep their done jobs, as the newest run that recorded it
    did (PGDRAIN_RETAIN_DONE=0: False); None when no run has said."""
    row = conn.execute(query("runs_keep_done")).fetchone()
    return None if row is None else bool(row[0])


@dataclass(frozen=True)
class WakeRow:
    """A wake-up recorded for a set of queues (pgdrain.wakes)."""

    queue_set: str
    wake_at: dt.datetime
    state: str
    pending: bool
    in_s: float


def wake_list(conn: Connection, limit: int = CONTROL_PLANE_ROWS) -> list[WakeRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("wake_list"), {"limit": limit}).fetchall()
    return [WakeRow(**row) for row in rows]


@dataclass(frozen=True)
class KickRow:
    """A queue's kicks (pgdrain.kicks); None: never, or not held."""

    queue: str
    requested_at: dt.datetime | None
    kicked_at: dt.datetime | None
    held_until: dt.datetime | None


def kick_list(conn: Connection, limit: int = CONTROL_PLANE_ROWS) -> list[KickRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("kick_list"), {"limit": limit}).fetchall()
    return [KickRow(**row) for row in rows]


@dataclass(frozen=True)
class QueueLimitRow:
    """A queue's settings (pgdrain.queue_limits); None: not set."""

    queue: str
    max_running: int | None
    running: int
    rate_limit: int | None  # at most this many jobs started per rate_seconds
    rate_seconds: int | None
    window_started: int  # jobs started in the current rate window
    paused_at: dt.datetime | None


def queue_limit_list(conn: Connection, limit: int = CONTROL_PLANE_ROWS) -> list[QueueLimitRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("queue_limit_list"), {"limit": limit}).fetchall()
    return [QueueLimitRow(**row) for row in rows]


def queue_pause(conn: Connection, queue: str) -> dt.datetime:
    """Pause `queue`; returns when it was paused (the first pause's time, if it was already)."""
    row = conn.execute(query("queue_pause"), {"queue": queue}).fetchone()
    assert row is not None  # a function's one row
    return row[0]  # type: ignore[no-any-return]


def queue_resume(conn: Connection, queue: str) -> bool:
    """Resume `queue`; returns whether it was paused."""
    row = conn.execute(query("queue_resume"), {"queue": queue}).fetchone()
    assert row is not None
    return bool(row[0])
