"""The only module that executes queue SQL. Each function runs one named statement from
sql/queries.sql and returns dataclasses (frozen, but for the claimed job); a fenced statement
that matched no row comes back as an explicit lease-lost outcome, never swallowed and never
retried as an overwrite."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgdrain.db.sql import Migration, query, statements

Connection = psycopg.Connection[Any]
Operation = TypeVar("Operation", bound=Callable[..., Any])
T = TypeVar("T")

# Reads one JSON document at the start of a text (ClaimedJob.payload).
_decode_json_document = json.JSONDecoder().raw_decode


def one_statement(operation: Operation) -> Operation:
    """Mark an operation that executes exactly one statement, once, and then reads its result:
    a Session sends that statement together with its transaction's BEGIN, limits and COMMIT,
    in one round trip (session.py). Called with a plain connection it runs as ever."""
    operation.one_statement = True  # type: ignore[attr-defined]
    return operation


@dataclass(frozen=True)
class Statement(Generic[T]):
    """One named statement, its parameters, and how its result is read: what a Session sends
    in the round trip of another statement and reads when that round trip is back
    (Session.read_with_next), so that one reply carries both results."""

    text: LiteralString  # query(name): built by the function `<name>_statement`
    params: Mapping[str, Any]
    read: Callable[[psycopg.Cursor[Any]], T]

    def send(self, conn: Connection) -> psycopg.Cursor[Any]:
        return conn.execute(self.text, self.params)

    def run(self, conn: Connection) -> T:
        return self.read(self.send(conn))


# The job states and recovery policies the schema's CHECK constraints allow.
Status = Literal["queued", "running", "done", "failed", "parked", "cancelled"]
STATUSES: tuple[Status, ...] = ("queued", "running", "done", "failed", "parked", "cancelled")
FinishedStatus = Literal["done", "failed", "cancelled"]  # what purge and retention delete
FINISHED: tuple[FinishedStatus, ...] = ("done", "failed", "cancelled")
RecoveryPolicy = Literal["auto", "manual"]


@dataclass(frozen=True, slots=True)
class Held:
    """A job this run holds: the id and the token that proves the lease is still ours."""

    id: int
    token: uuid.UUID

    def __hash__(self) -> int:
        # By id alone: a run's attempts are dict keys and set members at every stage, and a
        # UUID hashes in Python (uuid.UUID.__hash__). Two attempts of one job share a hash
        # and are told apart by equality, which compares the token too.
        return hash(self.id)


# Not frozen, unlike the other results here: a frozen dataclass's __init__ sets each field
# through object.__setattr__, and a claim makes one per job on the drain's thread between a
# reply and the next claim (2.4x the cost: 1.5 against 0.6 us a job). Nothing assigns to it.
@dataclass(slots=True)
class ClaimedJob:
    """A job this run claimed: the row's fields the job needs, and its attempt's token."""

    id: int
    queue: str
    kind: str
    payload_json: str  # parsed by `payload`, in the thread that runs the job
    attempt: int
    max_attempts: int
    attempt_token: uuid.UUID
    # Made once per attempt: the run keys its bookkeeping by it at every stage, and the same
    # object found again is found by identity, without comparing tokens.
    held: Held = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.held = Held(self.id, self.attempt_token)

    @property
    def payload(self) -> Any:
        # The text is jsonb's output: one JSON document, nothing around it. raw_decode reads
        # that without json.loads's two whitespace scans and wrappers (0.2 against 0.85 us a
        # job for `{}`, in the job's thread, which shares the interpreter with the run's). Text
        # with anything around the document goes through json.loads, which reads or refuses it.
        text = self.payload_json
        try:
            value, end = _decode_json_document(text)
            if end == len(text):
                return value
        except ValueError:
            pass
        return json.loads(text)


@dataclass(frozen=True)
class Fenced:
    """The result of a fenced statement over several attempts, each told apart by its token:
    one run may hold two attempts of the same job (its lease expired, another run reclaimed
    it, this run claimed it again), and only the current one may be applied."""

    applied_attempts: frozenset[Held]
    lost_attempts: frozenset[Held]  # the fence matched nothing: another attempt owns the job

    @property
    def applied(self) -> frozenset[int]:
        return frozenset(h.id for h in self.applied_attempts)

    @property
    def lost(self) -> frozenset[int]:
        return frozenset(h.id for h in self.lost_attempts)


@dataclass(frozen=True)
class Failed:
    """job_fail's result: the attempt recorded as failed, and whether (and when) it retries."""

    id: int
    status: Literal["queued", "failed", "cancelled"]  # queued: retried at run_at
    attempt: int
    run_at: dt.datetime


@dataclass(frozen=True)
class LeaseLost:
    """A fenced statement matched no row: another attempt owns the job now."""

    id: int


@dataclass(frozen=True)
class Reclaimed:
    """A job whose lease had expired, taken back: queued again, failed or parked."""

    id: int
    status: Literal["queued", "failed", "parked"]  # parked: recovery_policy manual
    reclaim_count: int


# queue_stats counts done, failed, parked and cancelled jobs up to this many per queue.
STATS_HISTORY_BOUND = 10_000


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


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue, as build_job checked it."""

    kind: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: dt.datetime | None = None
    delay_seconds: float = 0.0
    max_attempts: int = 5
    recovery_policy: RecoveryPolicy = "auto"
    idempotency_key: str | None = None


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
    run_at: dt.datetime
    lease_expires_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    last_error: str | None


def _new_job_params(job: NewJob) -> dict[str, Any]:
    return {
        "queue": job.queue,
        "kind": job.kind,
        "payload": Jsonb({} if job.payload is None else job.payload),
        "priority": job.priority,
        "run_at": job.run_at,
        "delay_seconds": job.delay_seconds,
        "max_attempts": job.max_attempts,
        "recovery_policy": job.recovery_policy,
        "idempotency_key": job.idempotency_key,
    }


def job_insert_statement(job: NewJob) -> tuple[str, dict[str, Any]]:
    """job_insert's text and its parameters as plain values (the payload as JSON text), for
    an application to run on its own driver, in its own transaction (enqueue_statement).
    Runs nothing itself: the statement is the one job_insert runs."""
    params = _new_job_params(job)
    params["payload"] = json.dumps(
        {} if job.payload is None else job.payload, ensure_ascii=False, allow_nan=False
    )
    # Without its comment lines (as every statement is sent): an application may log it.
    return statements()["job_insert"].text, params


def transaction_begin(conn: Connection) -> None:
    """BEGIN ISOLATION LEVEL READ COMMITTED, as a statement of its own: sent in a pipeline with
    the rest of the transaction (session.py)."""
    conn.execute(query("transaction_begin"))


def transaction_commit(conn: Connection) -> None:
    conn.execute(query("transaction_commit"))


def transaction_limits(conn: Connection, timeout_ms: int) -> None:
    """Bound the current transaction's statements and lock waits to `timeout_ms` (> 0: zero
    would switch the limits off)."""
    assert timeout_ms > 0, "a timeout of 0 disables the limit"
    conn.execute(query("transaction_limits"), {"timeout_ms": timeout_ms})


def session_limits(conn: Connection, timeout_ms: int) -> None:
    """Bound the connection's statements and lock waits to `timeout_ms` until set again, and
    its transactions READ COMMITTED (session.py)."""
    assert timeout_ms > 0, "a timeout of 0 disables the limit"
    conn.execute(query("session_limits"), {"timeout_ms": timeout_ms})


def job_insert(conn: Connection, job: NewJob) -> tuple[int, bool]:
    """Insert one job in the caller's transaction. Returns (id, created); an idempotency key
    held by an unfinished (queued or running) job of the same queue returns that job's id and
    created=False."""
    while True:
        row = conn.execute(query("job_insert"), _new_job_params(job)).fetchone()
        if row is not None:
            return int(row[0]), True
        assert job.idempotency_key is not None  # only a held key inserts nothing
        existing = job_find_by_key(conn, job.queue, job.idempotency_key)
        if existing is not None:
            return existing, False
        # The holder finished (freeing the key) or its insert rolled back between our two
        # statements: insert again. Safe to repeat: nothing was written, and a held key
        # still inserts nothing.


def job_find_by_key(conn: Connection, queue: str, idempotency_key: str) -> int | None:
    row = conn.execute(
        query("job_find_by_key"), {"queue": queue, "idempotency_key": idempotency_key}
    ).fetchone()
    return None if row is None else int(row[0])


def payload_json(payload: Any) -> str:
    """A job's payload as the jobs table receives it: JSON text (None is {}), non-ASCII
    characters as they are, not escaped (so its UTF-8 length is the size stored)."""
    return json.dumps({} if payload is None else payload, ensure_ascii=False)


def job_insert_many(
    conn: Connection, jobs: Sequence[NewJob], payloads_json: Sequence[str] | None = None
) -> list[int]:
    """Insert many jobs in one statement; returns the ids created (a key held by an
    unfinished job of the same queue is skipped). `payloads_json`, when given, holds each
    job's payload_json() already: enqueue_many encodes each payload once, to size its chunks,
    and sends that text."""
    if not jobs:
        return []
    if payloads_json is None:
        payloads_json = [payload_json(j.payload) for j in jobs]
    if len(payloads_json) != len(jobs):
        raise ValueError("one encoded payload per job")
    params = {
        "queues": [j.queue for j in jobs],
        "kinds": [j.kind for j in jobs],
        "payloads": list(payloads_json),
        "priorities": [j.priority for j in jobs],
        "run_ats": [j.run_at for j in jobs],
        "delays": [float(j.delay_seconds) for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "recovery_policies": [j.recovery_policy for j in jobs],
        "idempotency_keys": [j.idempotency_key for j in jobs],
    }
    return [int(r[0]) for r in conn.execute(query("job_insert_many"), params).fetchall()]


def periodic_enqueue(conn: Connection, due: Sequence[tuple[dt.datetime, NewJob]]) -> list[int]:
    """Enqueue each (slot, job) whose slot is later than the last enqueued for its kind, in one
    statement; returns the ids created (none for a slot enqueued already)."""
    if not due:
        return []
    params = {
        "kinds": [job.kind for _, job in due],
        "slots": [slot for slot, _ in due],
        "queues": [job.queue for _, job in due],
        "payloads": [Jsonb({} if job.payload is None else job.payload) for _, job in due],
        "priorities": [job.priority for _, job in due],
        "max_attempts": [job.max_attempts for _, job in due],
        "recovery_policies": [job.recovery_policy for _, job in due],
    }
    return [int(r[0]) for r in conn.execute(query("periodic_enqueue"), params).fetchall()]


def job_complete_and_claim_statement(
    finished: Sequence[Held],
    queues: Sequence[str],
    limit: int,
    worker: str,
    lease_seconds: float,
    cap_seconds: float | None,
    claim_id: uuid.UUID | None,
) -> Statement[tuple[Fenced, list[ClaimedJob]]]:
    """Mark `finished` done and claim up to `limit` ready jobs, in one statement (one commit),
    run by the run's claims (pipelined or not) and read by complete_and_claim_result. The
    statement returns the claimed jobs and only those of `finished` the fence refused.
    cap_seconds bounds every new lease to the run's deadline (None: uncapped, the control
    that shows what the cap prevents). claim_id, chosen by the caller, is stored on the
    claimed rows: job_claim_recover finds them by it after a lost reply."""
    params = {
        "done_ids": [h.id for h in finished],
        "done_tokens": [h.token for h in finished],
        "queues": list(queues),
        "limit": limit,
        "worker": worker,
        "lease_seconds": lease_seconds,
        "cap_seconds": cap_seconds,
        "claim_id": claim_id,
    }

    def read(cur: psycopg.Cursor[Any]) -> tuple[Fenced, list[ClaimedJob]]:
        return complete_and_claim_result(cur.fetchall(), finished)

    return Statement(query("job_complete_and_claim"), params, read)


def complete_and_claim_result(
    rows: Sequence[Any], finished: Sequence[Held]
) -> tuple[Fenced, list[ClaimedJob]]:
    """job_complete_and_claim's rows read: the attempts of `finished` it recorded done (all but
    those the fence refused: a row each, flagged) and the jobs it claimed."""
    lost = frozenset(Held(int(r[1]), r[7]) for r in rows if r[0])
    claimed = [ClaimedJob(*r[1:]) for r in rows if not r[0]]  # ClaimedJob's fields in order
    return Fenced(frozenset(finished) - lost, lost), claimed


@one_statement
def job_claim_recover(
    conn: Connection, claim_id: uuid.UUID | None, finished: Sequence[Held]
) -> tuple[Fenced, list[ClaimedJob]]:
    """What the claim `claim_id` already did (nothing, if it never committed): the attempts of
    `finished` it recorded done, and the jobs it claimed. Reads only."""
    rows = conn.execute(
        query("job_claim_recover"),
        {
            "claim_id": claim_id,
            "done_ids": [h.id for h in finished],
            "done_tokens": [h.token for h in finished],
        },
    ).fetchall()
    return _completed_and_claimed(rows, finished)


def _completed_and_claimed(
    rows: Sequence[Any], finished: Sequence[Held]
) -> tuple[Fenced, list[ClaimedJob]]:
    """Rows of (completed, ClaimedJob's fields): a completed row carries only id and token."""
    completed = frozenset(Held(int(r[1]), r[7]) for r in rows if r[0])
    claimed = [
        ClaimedJob(*r[1:])  # the statement returns ClaimedJob's fields in order
        for r in rows
        if not r[0]
    ]
    return Fenced(completed, frozenset(finished) - completed), claimed


@one_statement
def job_complete_many(conn: Connection, held: Sequence[Held]) -> Fenced:
    """Mark finished jobs done (claiming nothing)."""
    return _fenced(conn, query("job_complete_many"), held)


def _fenced(
    conn: Connection, statement: LiteralString, held: Sequence[Held], **extra: Any
) -> Fenced:
    """Run a fenced statement over `held`; it returns the (id, token) of each attempt whose
    fence matched."""
    if not held:
        return Fenced(frozenset(), frozenset())
    params = {"ids": [h.id for h in held], "tokens": [h.token for h in held], **extra}
    rows = conn.execute(statement, params).fetchall()
    applied = frozenset(Held(int(r[0]), r[1]) for r in rows)
    return Fenced(applied, frozenset(held) - applied)


@one_statement
def job_extend_leases(
    conn: Connection, held: Sequence[Held], lease_seconds: float, cap_seconds: float | None
) -> Fenced:
    """Heartbeat: extend every lease still ours in one statement."""
    return _fenced(
        conn,
        query("job_extend_leases"),
        held,
        lease_seconds=lease_seconds,
        cap_seconds=cap_seconds,
    )


@one_statement
def job_release_many(conn: Connection, held: Sequence[Held]) -> Fenced:
    """Give unstarted jobs back: queued again, the attempt not spent."""
    return _fenced(conn, query("job_release_many"), held)


@one_statement
def job_fail(
    conn: Connection,
    job: Held,
    error: str,
    delay_seconds: float,
    final: bool = False,
    *,
    error_record: dict[str, Any] | None = None,
    spend_attempt: bool = True,
    cancelled: bool = False,
) -> Failed | LeaseLost:
    """Record a failed attempt: retry after delay_seconds, or `failed` when attempts are spent
    (or at once when `final`: the job can never succeed as it is). `error_record` (text values
    already storable: no NUL, no lone surrogate) joins the job's error history, with the
    attempt number and time; `spend_attempt=False` (a snooze) gives the attempt back."""
    row = conn.execute(
        query("job_fail"),
        {
            "id": job.id,
            "token": job.token,
            "error": error,
            "delay_seconds": delay_seconds,
            "final": final,
            "spend_attempt": spend_attempt,
            "cancelled": cancelled,
            "error_record": None if error_record is None else Jsonb(error_record),
        },
    ).fetchone()
    if row is None:
        return LeaseLost(job.id)
    return Failed(id=row[0], status=row[1], attempt=row[2], run_at=row[3])


@one_statement
def job_reclaim_expired(conn: Connection, limit: int) -> list[Reclaimed]:
    return job_reclaim_expired_statement(limit).run(conn)


def job_reclaim_expired_statement(limit: int) -> Statement[list[Reclaimed]]:
    """Expired leases taken back: queued again, or failed when out of attempts."""

    def reclaimed(cur: psycopg.Cursor[Any]) -> list[Reclaimed]:
        return [Reclaimed(id=r[0], status=r[1], reclaim_count=r[2]) for r in cur.fetchall()]

    return Statement(query("job_reclaim_expired"), {"limit": limit}, reclaimed)


def job_retry(conn: Connection, ids: Sequence[int]) -> list[int]:
    rows = conn.execute(query("job_retry"), {"ids": list(ids)}).fetchall()
    return [int(r[0]) for r in rows]


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
    return cur.rowcount


@one_statement
def job_retention_batch(
    conn: Connection,
    done_days: float,
    failed_days: float,
    done_limit: int,
    failed_limit: int,
) -> tuple[int, int]:
    """Delete one batch of done jobs older than done_days and one of failed and cancelled jobs
    older than failed_days, in one statement; returns how many of each (pgdrain.db.retention)."""
    return job_retention_batch_statement(done_days, failed_days, done_limit, failed_limit).run(conn)


def job_retention_batch_statement(
    done_days: float, failed_days: float, done_limit: int, failed_limit: int
) -> Statement[tuple[int, int]]:
    params = {
        "done_days": done_days,
        "failed_days": failed_days,
        "done_limit": done_limit,
        "failed_limit": failed_limit,
    }

    def deleted_counts(cur: psycopg.Cursor[Any]) -> tuple[int, int]:
        row = cur.fetchone()
        assert row is not None  # one row of two counts
        return int(row[0]), int(row[1])

    return Statement(query("job_retention_batch"), params, deleted_counts)


def queue_stats(conn: Connection) -> list[QueueStats]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("queue_stats")).fetchall()
    return [QueueStats(**row) for row in rows]


@one_statement
def queue_has_ready(conn: Connection, queues: Sequence[str]) -> bool:
    row = conn.execute(query("queue_has_ready"), {"queues": list(queues)}).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class QueueDepth:
    """How many jobs are ready in some queues, and how long the oldest has waited."""

    ready: int
    oldest_ready_age_s: float


@one_statement
def queue_depth(conn: Connection, queues: Sequence[str]) -> QueueDepth:
    """How many jobs are ready in these queues, and how long the oldest has waited."""
    row = conn.execute(query("queue_depth"), {"queues": list(queues)}).fetchone()
    if row is None:
        return QueueDepth(0, 0.0)
    return QueueDepth(ready=int(row[0]), oldest_ready_age_s=float(row[1]))


def job_list(
    conn: Connection,
    statuses: Sequence[str],
    limit: int,
    *,
    queue: str | None = None,
    kind: str | None = None,
    since: dt.datetime | None = None,
) -> list[JobRow]:
    """The newest `limit` jobs matching the filters (None matches every job)."""
    params = {
        "statuses": list(statuses),
        "limit": limit,
        "queue": queue,
        "kind": kind,
        "since": since,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("job_list"), params).fetchall()
    return [JobRow(**row) for row in rows]


@dataclass(frozen=True)
class KickDecision:
    """What a kick does per queue: invoke a run now (`invoke`), or ask for a wake-up when its
    next job is due (`later`: nothing is ready, no live run drains it, and no wake-up pending
    for it comes early enough)."""

    invoke: list[str]
    later: dict[str, dt.datetime]


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
    )


@one_statement
def kick_clear(conn: Connection, queues: Sequence[str]) -> None:
    """Forget the last invoke of these queues (it failed): the next kick invokes."""
    conn.execute(query("kick_clear"), {"queues": list(queues)})


# -- the control plane: runs, fan-out, exit, wake-ups (pgdrain.aws) -------------------------


@one_statement
def queue_ready_count(conn: Connection, queues: Sequence[str], limit: int) -> int:
    """Ready jobs in these queues, counted up to `limit`."""
    row = conn.execute(
        query("queue_ready_count"), {"queues": list(queues), "limit": limit}
    ).fetchone()
    return 0 if row is None else int(row[0])


@one_statement
def run_register(
    conn: Connection,
    run_id: str,
    queues: Sequence[str],
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
            "queues": list(queues),
            "chain": chain,
            "remaining_seconds": remaining_seconds,
            "hold_seconds": hold_seconds,
        },
    )


@one_statement
def kick_hold(conn: Connection, queues: Sequence[str], hold_seconds: float) -> None:
    """Renew this run's hold on its queues' kicks until now + hold_seconds."""
    conn.execute(query("kick_hold"), {"queues": list(queues), "hold_seconds": hold_seconds})


def run_gate_lock(conn: Connection) -> None:
    """Hold the fan-out gate until the transaction ends."""
    conn.execute(query("run_gate_lock"))


def run_spawn(
    conn: Connection,
    queues: Sequence[str],
    chain: int,
    runs_needed: int,
    max_runs: int,
    reserve_seconds: float,
) -> list[str]:
    """Reserve new runs until `runs_needed` are live, never more than `max_runs`; returns the
    reserved run ids. Decisions serialise on the gate, so concurrent spawners keep the cap."""
    with conn.transaction():
        run_gate_lock(conn)
        rows = conn.execute(
            query("run_spawn"),
            {
                "queues": list(queues),
                "chain": chain,
                "runs_needed": runs_needed,
                "max_runs": max_runs,
                "reserve_seconds": reserve_seconds,
            },
        ).fetchall()
    return [str(r[0]) for r in rows]


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


@one_statement
def run_exit(
    conn: Connection,
    run_id: str,
    queues: Sequence[str],
    *,
    may_stay: bool = False,
    linger_window_s: float = 0.0,
    clear_kicks: bool = True,
) -> ExitCheck:
    """The run exits, unless (may_stay) a kick or a ready job came after its last claim, or
    its queues' latest kick is younger than linger_window_s; the check says which, and when
    work is next due."""
    row = conn.execute(
        query("run_exit"),
        {
            "run_id": run_id,
            "queues": list(queues),
            "may_stay": may_stay,
            "linger_window_s": linger_window_s,
            "clear_kicks": clear_kicks,
        },
    ).fetchone()
    assert row is not None  # one row, from the one-row CTEs
    return ExitCheck(
        kicked=bool(row[0]),
        kick_age_s=row[1],
        ready=bool(row[2]),
        due_at=row[3],
        exited=bool(row[4]),
    )


@one_statement
def queue_limit_sync(
    conn: Connection, queues: Sequence[str], limits: Sequence[tuple[str, int]]
) -> None:
    """Make the limits of `queues` in pgdrain.queue_limits exactly `limits` (queue, max)."""
    conn.execute(
        query("queue_limit_sync"),
        {
            "queues": list(queues),
            "limited": [q for q, _ in limits],
            "limits": [n for _, n in limits],
        },
    )


@one_statement
def wake_reserve(
    conn: Connection, queue_set: str, wake_at: dt.datetime, run_id: str, hold_seconds: float
) -> bool:
    """True when the caller must create the schedule for `wake_at` (no earlier or equal wake-up
    of these queues is pending); the reservation holds for hold_seconds."""
    row = conn.execute(
        query("wake_reserve"),
        {
            "queue_set": queue_set,
            "wake_at": wake_at,
            "run_id": run_id,
            "hold_seconds": hold_seconds,
        },
    ).fetchone()
    return row is not None


@one_statement
def wake_created(conn: Connection, queue_set: str, wake_at: dt.datetime, run_id: str) -> None:
    conn.execute(
        query("wake_created"), {"queue_set": queue_set, "wake_at": wake_at, "run_id": run_id}
    )


@one_statement
def wake_release(conn: Connection, queue_set: str, wake_at: dt.datetime, run_id: str) -> None:
    conn.execute(
        query("wake_release"), {"queue_set": queue_set, "wake_at": wake_at, "run_id": run_id}
    )


# -- migrations: run by pgdrain.db.migrate inside one transaction ------------------------------


def migration_lock_timeout(conn: Connection, timeout_ms: int) -> None:
    """Wait at most this long for any lock, until the transaction ends."""
    conn.execute(query("migration_lock_timeout"), {"timeout": f"{timeout_ms}ms"})


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


def job_show(conn: Connection, job_id: int) -> dict[str, Any] | None:
    """Every column of one job (JSON types: timestamps as ISO text), or None if unknown."""
    row = conn.execute(query("job_show"), {"id": job_id}).fetchone()
    if row is None:
        return None
    job: dict[str, Any] = row[0]
    return job


@dataclass(frozen=True)
class Matched:
    """A job an operator action by filter changed (or, in a dry run, would change)."""

    id: int
    queue: str
    kind: str


def job_retry_matching(
    conn: Connection,
    statuses: Sequence[Literal["failed", "parked"]],
    *,
    queue: str | None = None,
    kind: str | None = None,
    since: dt.datetime | None = None,
) -> list[Matched]:
    """Queue again every failed/parked job matching the filters (None matches all)."""
    params = {"statuses": list(statuses), "queue": queue, "kind": kind, "since": since}
    rows = conn.execute(query("job_retry_matching"), params).fetchall()
    return [Matched(int(r[0]), str(r[1]), str(r[2])) for r in rows]


@dataclass(frozen=True)
class Cancelled:
    """A job an operator cancelled, and the status it had."""

    id: int
    was: Literal["queued", "running", "parked"]


def job_cancel(conn: Connection, ids: Sequence[int]) -> list[Cancelled]:
    """Cancel these jobs; those already finished (or unknown) are not returned."""
    rows = conn.execute(query("job_cancel"), {"ids": list(ids)}).fetchall()
    return sorted((Cancelled(int(r[0]), r[1]) for r in rows), key=lambda c: c.id)


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
