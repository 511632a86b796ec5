"""The only module that executes queue SQL. Each function runs one named statement from
sql/queries.sql and returns frozen dataclasses; a fenced statement that matched no row comes
back as an explicit lease-lost outcome, never swallowed and never retried as an overwrite."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, LiteralString

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgdrain.sql import Migration, query

Connection = psycopg.Connection[Any]
# The job states and recovery policies the schema's CHECK constraints allow.
Status = Literal["queued", "running", "done", "failed"]
RecoveryPolicy = Literal["auto", "manual"]


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: int
    queue: str
    kind: str
    payload_json: str  # parsed by `payload`, in the thread that runs the job
    attempt: int
    max_attempts: int
    attempt_token: uuid.UUID

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @property
    def held(self) -> Held:
        return Held(self.id, self.attempt_token)


@dataclass(frozen=True)
class Held:
    """A job this run holds: the id and the token that proves the lease is still ours."""

    id: int
    token: uuid.UUID


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
    id: int
    status: Literal["queued", "failed"]  # queued: retried at run_at; failed: for good
    attempt: int
    run_at: dt.datetime


@dataclass(frozen=True)
class LeaseLost:
    id: int


@dataclass(frozen=True)
class Reclaimed:
    id: int
    status: Literal["queued", "failed"]
    reclaim_count: int


@dataclass(frozen=True)
class QueueStats:
    queue: str
    queued: int
    ready: int
    running: int
    done: int
    failed: int
    oldest_ready_age_s: float
    expired_leases: int


@dataclass(frozen=True)
class NewJob:
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


def transaction_limits(conn: Connection, timeout_ms: int) -> None:
    """Bound the current transaction's statements and lock waits to `timeout_ms` (> 0: zero
    would switch the limits off)."""
    assert timeout_ms > 0, "a timeout of 0 disables the limit"
    conn.execute(query("transaction_limits"), {"timeout_ms": timeout_ms})


def job_insert(conn: Connection, job: NewJob) -> tuple[int, bool]:
    """Insert one job in the caller's transaction. Returns (id, created); a repeated
    idempotency key returns the existing job's id and created=False."""
    row = conn.execute(query("job_insert"), _new_job_params(job)).fetchone()
    if row is not None:
        return int(row[0]), True
    assert job.idempotency_key is not None  # only a known key inserts nothing
    existing = job_find_by_key(conn, job.idempotency_key)
    if existing is None:  # the other insert rolled back between our two statements
        return job_insert(conn, job)
    return existing, False


def job_find_by_key(conn: Connection, idempotency_key: str) -> int | None:
    row = conn.execute(query("job_find_by_key"), {"idempotency_key": idempotency_key}).fetchone()
    return None if row is None else int(row[0])


def job_insert_many(conn: Connection, jobs: Sequence[NewJob]) -> list[int]:
    """Insert many jobs in one statement; returns the ids created (known keys are skipped)."""
    if not jobs:
        return []
    params = {
        "queues": [j.queue for j in jobs],
        "kinds": [j.kind for j in jobs],
        "payloads": [Jsonb({} if j.payload is None else j.payload) for j in jobs],
        "priorities": [j.priority for j in jobs],
        "run_ats": [j.run_at for j in jobs],
        "delays": [float(j.delay_seconds) for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "recovery_policies": [j.recovery_policy for j in jobs],
        "idempotency_keys": [j.idempotency_key for j in jobs],
    }
    return [int(r[0]) for r in conn.execute(query("job_insert_many"), params).fetchall()]


def job_complete_and_claim(
    conn: Connection,
    finished: Sequence[Held],
    queues: Sequence[str],
    limit: int,
    worker: str,
    lease_seconds: float,
    cap_seconds: float | None,
    claim_id: uuid.UUID | None = None,
) -> tuple[Fenced, list[ClaimedJob]]:
    """Mark `finished` done and claim up to `limit` ready jobs, in one statement (one commit).
    cap_seconds bounds every new lease to the run's deadline (None leaves it uncapped: only
    tests do that, to show what the cap prevents). claim_id, chosen by the caller, is stored
    on the claimed rows: job_claim_recover finds them by it after a lost reply."""
    rows = conn.execute(
        query("job_complete_and_claim"),
        {
            "done_ids": [h.id for h in finished],
            "done_tokens": [h.token for h in finished],
            "queues": list(queues),
            "limit": limit,
            "worker": worker,
            "lease_seconds": lease_seconds,
            "cap_seconds": cap_seconds,
            "claim_id": claim_id,
        },
    ).fetchall()
    return _completed_and_claimed(rows, finished)


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


def job_release_many(conn: Connection, held: Sequence[Held]) -> Fenced:
    """Give unstarted jobs back: queued again, the attempt not spent."""
    return _fenced(conn, query("job_release_many"), held)


def job_fail(
    conn: Connection, job: Held, error: str, delay_seconds: float, final: bool = False
) -> Failed | LeaseLost:
    """Record a failed attempt: retry after delay_seconds, or `failed` when attempts are spent
    (or at once when `final`: the job can never succeed as it is)."""
    row = conn.execute(
        query("job_fail"),
        {
            "id": job.id,
            "token": job.token,
            "error": error,
            "delay_seconds": delay_seconds,
            "final": final,
        },
    ).fetchone()
    if row is None:
        return LeaseLost(job.id)
    return Failed(id=row[0], status=row[1], attempt=row[2], run_at=row[3])


def job_reclaim_expired(conn: Connection, limit: int) -> list[Reclaimed]:
    rows = conn.execute(query("job_reclaim_expired"), {"limit": limit}).fetchall()
    return [Reclaimed(id=r[0], status=r[1], reclaim_count=r[2]) for r in rows]


def job_retry(conn: Connection, ids: Sequence[int]) -> list[int]:
    rows = conn.execute(query("job_retry"), {"ids": list(ids)}).fetchall()
    return [int(r[0]) for r in rows]


def job_purge_finished(conn: Connection, older_than_days: float, batch: int = 5000) -> int:
    """Delete done/failed jobs in batches (each its own short statement); returns the count."""
    total = 0
    while True:
        cur = conn.execute(query("job_purge_finished"), {"days": older_than_days, "limit": batch})
        total += cur.rowcount
        if cur.rowcount < batch:
            return total


def queue_stats(conn: Connection) -> list[QueueStats]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("queue_stats")).fetchall()
    return [QueueStats(**row) for row in rows]


def queue_has_ready(conn: Connection, queues: Sequence[str]) -> bool:
    row = conn.execute(query("queue_has_ready"), {"queues": list(queues)}).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class QueueDepth:
    ready: int
    oldest_ready_age_s: float


def queue_depth(conn: Connection, queues: Sequence[str]) -> QueueDepth:
    """How many jobs are ready in these queues, and how long the oldest has waited."""
    row = conn.execute(query("queue_depth"), {"queues": list(queues)}).fetchone()
    if row is None:
        return QueueDepth(0, 0.0)
    return QueueDepth(ready=int(row[0]), oldest_ready_age_s=float(row[1]))


def job_list(conn: Connection, statuses: Sequence[str], limit: int) -> list[JobRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            query("job_list"), {"statuses": list(statuses), "limit": limit}
        ).fetchall()
    return [JobRow(**row) for row in rows]


def kick_debounce(conn: Connection, queues: Sequence[str], window_seconds: float) -> list[str]:
    """The queues whose last kick is older than the window, now marked as kicked."""
    rows = conn.execute(
        query("kick_debounce"), {"queues": list(queues), "window_seconds": window_seconds}
    ).fetchall()
    return sorted(str(r[0]) for r in rows)


# -- migrations: run by pgdrain.migrate inside one transaction ------------------------------


def migration_lock(conn: Connection) -> None:
    """Serialise concurrent migrations until the transaction ends (pooler-safe: xact lock)."""
    conn.execute(query("migration_lock"))


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
