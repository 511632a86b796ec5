"""The statements of the hot path: enqueue, and a run's claim, completions, failures, releases,
heartbeat and reclaim (sql/hot_path.sql). Every write after the claim is fenced by the
attempt's token; "0 rows" comes back as an explicit lease-lost outcome."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgdrain.db.sql import query, statements
from pgdrain.db.store.common import (
    ClaimedJob,
    ClaimPosition,
    Connection,
    Failed,
    Fenced,
    Held,
    LeaseLost,
    NewJob,
    Reclaimed,
    Statement,
    _fenced,
    one_statement,
    queue_names,
)
from pgdrain.errors import BadInput

# What the table holds at most (migration 0015's CHECK constraints): the limits build_job()
# enforces, for rows written by any driver. A payload's size is its text as stored (jsonb's
# output); build_job() allows a quarter of it, measured as json.dumps writes it.
MAX_STORED_PAYLOAD_BYTES = 1024 * 1024
# At most this much payload text in one claim, and always its first job (hot_path.sql's
# job_complete_and_claim).
MAX_CLAIM_PAYLOAD_BYTES = 4 * 1024 * 1024


def transaction_begin(conn: Connection) -> None:
    """BEGIN ISOLATION LEVEL READ COMMITTED, as a statement of its own: sent in a pipeline with
    the rest of the transaction (session.py)."""
    conn.execute(query("transaction_begin"))


def transaction_commit(conn: Connection) -> None:
    conn.execute(query("transaction_commit"))


def transaction_rollback(conn: Connection) -> None:
    """End a transaction a failed statement left open (its COMMIT was not run)."""
    conn.execute(query("transaction_rollback"))


def transaction_open(conn: Connection) -> None:
    """Have psycopg begin the caller's transaction on a connection that is not autocommit (it
    does before the first statement), so that conn.transaction() then takes a savepoint in it
    instead of a transaction of its own that it would commit."""
    conn.execute(query("transaction_open"))


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
        "sequence": job.sequence,
        "depends_on": None if job.after is None else list(job.after),
    }


def _depends_on_text(after: tuple[int, ...] | None) -> str | None:
    """A job's dependencies as array text ('{1,2}'): job_insert_many sends one text per row."""
    return None if after is None else "{" + ",".join(str(int(i)) for i in after) + "}"


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


def job_insert(conn: Connection, job: NewJob) -> tuple[int, bool]:
    """Insert one job in the caller's transaction. Returns (id, created); an idempotency key
    held by an unfinished job of the same queue returns that job's id and created=False. A
    dependency that does not exist raises BadInput (the caller's transaction is then failed:
    nothing of it is written)."""
    while True:
        with refused_insert():
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
    return json.dumps({} if payload is None else payload, ensure_ascii=False, allow_nan=False)


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
        "sequences": [j.sequence for j in jobs],
        "depends_on": [_depends_on_text(j.after) for j in jobs],
    }
    with refused_insert():
        rows = conn.execute(query("job_insert_many"), params).fetchall()
    return [int(r[0]) for r in rows]


@contextmanager
def refused_insert() -> Iterator[None]:
    """What the table refuses of an enqueue that the API's checks cannot see, as BadInput, one
    line: a dependency named that does not exist (migration 0021's trigger), and a payload
    over 1 MiB as jsonb writes it out (numbers in full: `1e308` takes 309 characters)."""
    try:
        yield
    except psycopg.errors.ForeignKeyViolation as exc:
        if exc.diag.constraint_name != "jobs_depends_on_exist":
            raise
        raise BadInput(str(exc.diag.message_primary).removeprefix("pgdrain: ")) from None
    except psycopg.errors.CheckViolation as exc:
        if exc.diag.constraint_name != "jobs_payload_size_chk":
            raise
        raise BadInput(
            "payload is over 1 MiB as stored (jsonb writes numbers out in full): store the "
            "data in a table and pass its id"
        ) from None


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


@one_statement
def job_status_many(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    """Each job's status now; a job that no longer exists is absent."""
    rows = conn.execute(query("job_status_many"), {"ids": list(ids)}).fetchall()
    return {int(r[0]): str(r[1]) for r in rows}


def job_complete_and_claim_statement(
    finished: Sequence[Held],
    queues: Sequence[str] | None,
    limit: int,
    worker: str,
    lease_seconds: float,
    cap_seconds: float | None,
    claim_id: uuid.UUID | None,
    positions: Mapping[str, ClaimPosition] | None = None,
    *,
    keep_done: bool = True,
) -> Statement[tuple[Fenced, list[ClaimedJob]]]:
    """Mark `finished` done and claim up to `limit` ready jobs, in one statement (one commit),
    run by the run's claims (pipelined or not) and read by complete_and_claim_result. The
    statement returns the claimed jobs and only those of `finished` the fence refused.
    cap_seconds bounds every new lease to the run's deadline (None: uncapped, the control
    that shows what the cap prevents). claim_id, chosen by the caller, is stored on the
    claimed rows: job_claim_recover finds them by it after a lost reply. `positions`: per
    queue, the job after which its scan starts (runner/positions.py); a queue without one is
    read from its start, and so is one whose jobs after the position run out. keep_done False
    (PGDRAIN_RETAIN_DONE=0): a done job is deleted, not moved to finished_jobs, unless its
    finish releases another."""
    at = positions or {}
    params = {
        "done_ids": [h.id for h in finished],
        "done_tokens": [h.token for h in finished],
        "queues": queue_names(queues),
        "position_queue": list(at),
        "position_priority": [p.priority for p in at.values()],
        "position_run_at_us": [p.run_at_us for p in at.values()],
        "position_id": [p.id for p in at.values()],
        "limit": limit,
        "worker": worker,
        "lease_seconds": lease_seconds,
        "cap_seconds": cap_seconds,
        "claim_id": claim_id,
        "keep_done": keep_done,
    }

    def read(cur: psycopg.Cursor[Any]) -> tuple[Fenced, list[ClaimedJob]]:
        return complete_and_claim_result(cur.fetchall(), finished)

    return Statement(query("job_complete_and_claim"), params, read)


# The `kind` of the row job_complete_and_claim returns for each paused queue of the run's.
PAUSED_FLAG = "paused"


def complete_and_claim_result(
    rows: Sequence[Any], finished: Sequence[Held]
) -> tuple[Fenced, list[ClaimedJob]]:
    """job_complete_and_claim's rows read: the attempts of `finished` it recorded done (all but
    those the fence refused: a row each, flagged), the queues it found paused (lost NULL) and
    the jobs it claimed."""
    lost = frozenset(Held(int(r[1]), r[7]) for r in rows if r[0])
    # `lost` NULL flags the rows of a paused queue (kind 'paused') and of claim_served_queues.
    paused = frozenset(r[2] for r in rows if r[0] is None and r[3] == PAUSED_FLAG)
    claimed = [ClaimedJob(*r[1:]) for r in rows if r[0] is False]  # ClaimedJob's fields in order
    return Fenced(frozenset(finished) - lost, lost, paused), claimed


def claim_served_queues(rows: Sequence[Any]) -> tuple[str, ...] | None:
    """The queues a job_complete_and_claim of every queue found jobs to claim in, from its
    rows; None from a claim of queues named, or one that found none."""
    served = tuple(str(r[2]) for r in rows if r[0] is None and r[3] is None)
    return served if served else None


@one_statement
def job_claim_recover(
    conn: Connection,
    claim_id: uuid.UUID | None,
    finished: Sequence[Held],
    *,
    keep_done: bool = True,
) -> tuple[Fenced, list[ClaimedJob]]:
    """What the claim `claim_id` already did (nothing, if it never committed): the attempts of
    `finished` it recorded done, and the jobs it claimed. Reads only. keep_done as the
    completions were sent with (False: a completed job left no row)."""
    rows = conn.execute(
        query("job_claim_recover"),
        {
            "claim_id": claim_id,
            "done_ids": [h.id for h in finished],
            "done_tokens": [h.token for h in finished],
            "keep_done": keep_done,
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
def job_complete_many(conn: Connection, held: Sequence[Held], *, keep_done: bool = True) -> Fenced:
    """Mark finished jobs done (claiming nothing); keep_done as job_complete_and_claim's."""
    return _fenced(conn, query("job_complete_many"), held, keep_done=keep_done)


@one_statement
def job_record_many(
    conn: Connection, recorded: Sequence[tuple[Held, str | None, str | None]]
) -> Fenced:
    """Write what running attempts recorded: (attempt, output JSON, progress JSON), None where
    nothing was recorded. Fenced: an attempt whose lease is gone writes nothing."""
    held = [h for h, _, _ in recorded]
    return _fenced(
        conn,
        query("job_record_many"),
        held,
        outputs=[o for _, o, _ in recorded],
        progress=[p for _, _, p in recorded],
    )


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
def job_release_stopped(conn: Connection, held: Sequence[Held], message: str) -> Fenced:
    """Give back the attempts a stop cut short, of jobs whose policy is auto and whose reclaims
    are fewer than their attempts: queued again at once, the attempt not spent, `message` in
    their error history. Those not applied are manual, past that bound, or no longer this
    run's."""
    return _fenced(conn, query("job_release_stopped"), held, message=message)


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
def floors_raise(conn: Connection) -> None:
    """Raise the floors a run's scans start from: the reclaim's (migration 0024) and each
    queue's (migration 0026), each unless a writer of its rows is in flight."""
    conn.execute(query("floors_raise"))


@one_statement
def job_reclaim_expired(conn: Connection, limit: int) -> list[Reclaimed]:
    return job_reclaim_expired_statement(limit).run(conn)


def job_reclaim_expired_statement(limit: int) -> Statement[list[Reclaimed]]:
    """Expired leases taken back: queued again, or failed when out of attempts."""

    def reclaimed(cur: psycopg.Cursor[Any]) -> list[Reclaimed]:
        return [Reclaimed(id=r[0], status=r[1], reclaim_count=r[2]) for r in cur.fetchall()]

    return Statement(query("job_reclaim_expired"), {"limit": limit}, reclaimed)


@one_statement
def queue_has_ready(conn: Connection, queues: Sequence[str] | None) -> bool:
    """Is a job ready in these queues (None: in any queue)?"""
    row = conn.execute(query("queue_has_ready"), {"queues": queue_names(queues)}).fetchone()
    return bool(row and row[0])
