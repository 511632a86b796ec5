"""The attempt_token fence: a worker whose lease was lost writes nothing.

Each scenario runs twice with one variable changed: the real statement refuses the stale
token, and a test-only copy of the same statement without its fence line lets the stale write
through. The control is what the fence line is for.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from helpers.fixtures import (
    claim_batch,
    complete_and_claim,
    job_row,
    unfenced,
    wait_for,
    without_line,
)
from helpers.lock_waits import waits_on_a_lock
from pgdrain import enqueue
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]

WORKER = "fence-test"
SHORT_LEASE_SECONDS = 0.05
LEASE_SECONDS = 300.0
WAIT_SECONDS = 60.0  # generous: other suites load this machine
LOCK_TIMEOUT = "60s"  # a statement that should not block fails instead of hanging the suite


def _claim(conn: Conn, lease_seconds: float = LEASE_SECONDS) -> store.ClaimedJob:
    [claimed] = claim_batch(conn, ["default"], 1, WORKER, lease_seconds, None)
    return claimed


def _lease_expired(conn: Conn, job_id: int) -> bool:
    row = conn.execute(
        "SELECT lease_expires_at < now() FROM pgdrain.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    return bool(row and row[0])


def _stale_and_current(conn: Conn) -> tuple[store.Held, store.Held]:
    """A job whose first attempt's lease expired and was reclaimed, then claimed again:
    the first token is stale, the second is the current owner's."""
    job_id = enqueue(conn, "send_email", {"email_id": 1})
    first = _claim(conn, SHORT_LEASE_SECONDS)
    wait_for(lambda: _lease_expired(conn, job_id), WAIT_SECONDS, "the short lease to expire")
    assert [r.id for r in store.job_reclaim_expired(conn, 10)] == [job_id]
    second = _claim(conn)
    assert second.id == job_id and second.attempt == 2
    return store.Held(job_id, first.attempt_token), store.Held(job_id, second.attempt_token)


def _held_params(held: store.Held) -> dict[str, Any]:
    return {"ids": [held.id], "tokens": [held.token]}


def _complete_params(held: store.Held) -> dict[str, Any]:
    return {**_held_params(held), "keep_done": True}


def _fail_params(held: store.Held) -> dict[str, Any]:
    return {
        "id": held.id,
        "token": held.token,
        "error": "stale worker's error",
        "delay_seconds": 0.0,
        "final": False,
        "spend_attempt": True,
        "cancelled": False,
        "error_record": None,
    }


def _complete_and_claim_params(held: store.Held) -> dict[str, Any]:
    return {
        "done_ids": [held.id],
        "done_tokens": [held.token],
        "queues": ["default"],
        "limit": 0,  # complete, claim nothing: the claim half is not under test here
        "worker": WORKER,
        "lease_seconds": LEASE_SECONDS,
        "cap_seconds": None,
        "claim_id": None,
        "keep_done": True,
        "position_queue": [],
        "position_priority": [],
        "position_run_at_us": [],
        "position_id": [],
    }


def _extend_params(held: store.Held) -> dict[str, Any]:
    return {**_held_params(held), "lease_seconds": 3600.0, "cap_seconds": None}


def _complete(conn: Conn, held: store.Held) -> frozenset[int]:
    return store.job_complete_many(conn, [held]).applied


def _complete_and_claim(conn: Conn, held: store.Held) -> frozenset[int]:
    fenced, claimed = complete_and_claim(conn, [held], ["default"], 0, WORKER, LEASE_SECONDS, None)
    assert claimed == []
    return fenced.applied


def _fail(conn: Conn, held: store.Held) -> frozenset[int]:
    outcome = store.job_fail(conn, held, "stale worker's error", 0.0)
    return frozenset() if isinstance(outcome, store.LeaseLost) else frozenset({outcome.id})


def _extend(conn: Conn, held: store.Held) -> frozenset[int]:
    return store.job_extend_leases(conn, [held], 3600.0, None).applied


def _release(conn: Conn, held: store.Held) -> frozenset[int]:
    return store.job_release_many(conn, [held]).applied


Operation = Callable[[Conn, store.Held], frozenset[int]]  # returns the ids it wrote
Params = Callable[[store.Held], dict[str, Any]]  # what store.py binds for the statement

# statement name -> (the real operation through pgdrain.db.store, its parameters for the control)
OPERATIONS: dict[str, tuple[Operation, Params]] = {
    "job_complete_many": (_complete, _complete_params),
    "job_complete_and_claim": (_complete_and_claim, _complete_and_claim_params),
    "job_fail": (_fail, _fail_params),
    "job_extend_leases": (_extend, _extend_params),
    "job_release_many": (_release, _held_params),
}


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_stale_token_writes_nothing(conn: Conn, name: str) -> None:
    operation, _ = OPERATIONS[name]
    stale, current = _stale_and_current(conn)
    before = job_row(conn, stale.id)

    assert operation(conn, stale) == frozenset()

    assert job_row(conn, stale.id) == before
    assert before["status"] == "running" and before["attempt_token"] == current.token


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_control_without_the_fence_the_stale_write_goes_through(conn: Conn, name: str) -> None:
    _, params = OPERATIONS[name]
    stale, current = _stale_and_current(conn)
    before = job_row(conn, stale.id)

    rows = conn.execute(unfenced(name), params(stale)).fetchall()

    # The stale worker is told its write went through: the row it wrote comes back, or (the
    # claim's completions) no row of a refused attempt does.
    assert rows == [] if name == "job_complete_and_claim" else len(rows) == 1
    after = job_row(conn, stale.id)
    assert after != before
    if name == "job_extend_leases":  # the stale worker stretched the new owner's lease
        assert after["attempt_token"] == current.token
        assert after["lease_expires_at"] > before["lease_expires_at"]
    else:  # the stale worker ended the new owner's attempt
        assert after["attempt_token"] is None
        assert after["status"] != "running"


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_current_token_still_writes(conn: Conn, name: str) -> None:
    """The fence refuses stale tokens only: the current owner's write goes through."""
    operation, _ = OPERATIONS[name]
    _stale, current = _stale_and_current(conn)
    assert operation(conn, current) == {current.id}


# A long list of held attempts is fenced by a hash of its pairs, a short one by comparing each
# token in turn (hot_path.sql): the same stale write, among 150 current ones.
LONG_LIST = 150
LIST_OPERATIONS = ("job_complete_and_claim", "job_complete_many", "job_extend_leases")


def _with_many_current(conn: Conn, stale: store.Held) -> list[store.Held]:
    for n in range(LONG_LIST):
        enqueue(conn, "send_email", {"email_id": n})
    current = [
        c.held for c in claim_batch(conn, ["default"], LONG_LIST, WORKER, LEASE_SECONDS, None)
    ]
    assert len(current) == LONG_LIST
    return [*current[:75], stale, *current[75:]]


def _list_params(name: str, held: list[store.Held]) -> dict[str, Any]:
    lists = {"ids": [h.id for h in held], "tokens": [h.token for h in held]}
    if name == "job_complete_and_claim":
        return {
            **_complete_and_claim_params(held[0]),
            "done_ids": lists["ids"],
            "done_tokens": lists["tokens"],
        }
    if name == "job_extend_leases":
        return {**_extend_params(held[0]), **lists}
    return {**lists, "keep_done": True}


def _write_list(conn: Conn, name: str, held: list[store.Held], fenced: bool) -> set[int]:
    """The ids the statement wrote (as it reports them)."""
    if fenced and name == "job_complete_and_claim":
        return set(
            complete_and_claim(conn, held, ["default"], 0, WORKER, LEASE_SECONDS, None)[0].applied
        )
    if fenced and name == "job_complete_many":
        return set(store.job_complete_many(conn, held).applied)
    if fenced:
        return set(store.job_extend_leases(conn, held, 3600.0, None).applied)
    rows = conn.execute(unfenced(name), _list_params(name, held)).fetchall()
    if name == "job_complete_and_claim":  # it returns only the attempts it refused
        return {h.id for h in held} - {row[1] for row in rows}
    return {row[0] for row in rows}


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control-unfenced"])
@pytest.mark.parametrize("name", LIST_OPERATIONS)
def test_a_stale_token_among_many_writes_nothing_only_with_the_fence(
    conn: Conn, name: str, fenced: bool
) -> None:
    stale, current = _stale_and_current(conn)
    held = _with_many_current(conn, stale)
    before = job_row(conn, stale.id)

    written = _write_list(conn, name, held, fenced)

    others = {h.id for h in held} - {stale.id}
    assert others <= written  # the current attempts' writes go through either way
    after = job_row(conn, stale.id)
    if fenced:
        assert stale.id not in written and after == before
        assert after["attempt_token"] == current.token
    else:
        assert stale.id in written and after != before


# The reclaim race: reclaim reads an expired lease's token, then writes. Between the two,
# another worker takes the job (after a reclaim of its own) with a fresh token.


def _connect(url: str) -> Conn:
    return psycopg.connect(url, autocommit=True, options=f"-c lock_timeout={LOCK_TIMEOUT}")


@pytest.fixture
def expired_job(conn: Conn) -> tuple[int, uuid.UUID]:
    """A running job whose lease has expired: the reclaim's target."""
    job_id = enqueue(conn, "send_email", {"email_id": 1})
    claimed = _claim(conn, SHORT_LEASE_SECONDS)
    wait_for(lambda: _lease_expired(conn, job_id), WAIT_SECONDS, "the short lease to expire")
    return job_id, claimed.attempt_token


@pytest.fixture
def other_worker(db_url: str) -> Iterator[Conn]:
    """A connection standing for the worker that takes the job between reclaim's read and
    its write; it holds its transaction open until the test commits it."""
    with psycopg.connect(db_url) as other:
        yield other


def _retake(other: Conn, job_id: int) -> uuid.UUID:
    """In `other`'s open transaction: the job is taken again with a fresh token and lease
    (another worker claimed it after a reclaim). The row stays locked until commit."""
    row = other.execute(
        "UPDATE pgdrain.jobs"
        " SET attempt_token = gen_random_uuid(), lease_expires_at = now() + interval '1 min',"
        "     leased_by = 'other-worker', heartbeat_at = now(), attempts = attempts + 1"
        " WHERE id = %s AND status = 'running'"
        " RETURNING attempt_token",
        (job_id,),
    ).fetchone()
    assert row is not None
    token: uuid.UUID = row[0]
    return token


def _race(
    conn: Conn, db_url: str, other: Conn, job_id: int, statement: str
) -> tuple[list[tuple[Any, ...]], uuid.UUID]:
    """Run `statement` (a reclaim) on its own connection while `other` holds the re-taken
    row; once it is seen waiting for that row's lock, `other` commits. Returns the
    statement's rows and the new token."""
    new_token = _retake(other, job_id)
    outcome: dict[str, Any] = {}
    with _connect(db_url) as reclaimer:
        pid = reclaimer.info.backend_pid

        def run() -> None:
            try:
                outcome["rows"] = reclaimer.execute(statement, {"limit": 10}).fetchall()
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=run, name="reclaimer")
        thread.start()
        try:
            wait_for(
                lambda: waits_on_a_lock(conn, pid) or not thread.is_alive(),
                WAIT_SECONDS,
                "the reclaim to wait on the re-taken row",
            )
            assert thread.is_alive(), f"the reclaim did not block: {outcome}"
        finally:
            other.commit()
            thread.join(WAIT_SECONDS)
        assert not thread.is_alive(), "the reclaim is still blocked after the commit"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rows"], new_token


def test_reclaim_skips_a_row_another_worker_holds(
    conn: Conn, db_url: str, expired_job: tuple[int, uuid.UUID], other_worker: Conn
) -> None:
    """The real statement: SKIP LOCKED passes the row by rather than waiting for it."""
    job_id, _ = expired_job
    new_token = _retake(other_worker, job_id)
    with _connect(db_url) as reclaimer:
        assert store.job_reclaim_expired(reclaimer, 10) == []
    other_worker.commit()
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt_token"], row["reclaim_count"]) == (
        "running",
        new_token,
        0,
    )


def test_a_reclaim_whose_token_changed_before_its_write_changes_nothing(
    conn: Conn, db_url: str, expired_job: tuple[int, uuid.UUID], other_worker: Conn
) -> None:
    """Without the lock the reclaim reads the old token, blocks on the row, and after the
    other transaction commits re-checks its WHERE on the new row: the fence no longer
    matches, so nothing is written."""
    job_id, _ = expired_job
    no_lock = without_line(query("job_reclaim_expired"), "FOR UPDATE SKIP LOCKED")

    rows, new_token = _race(conn, db_url, other_worker, job_id, no_lock)

    assert rows == []
    row = job_row(conn, job_id)
    assert (row["status"], row["attempt_token"], row["reclaim_count"]) == (
        "running",
        new_token,
        0,
    )


def test_control_without_lock_and_fence_the_reclaim_overwrites_the_new_attempt(
    conn: Conn, db_url: str, expired_job: tuple[int, uuid.UUID], other_worker: Conn
) -> None:
    job_id, _ = expired_job
    no_lock_no_fence = without_line(unfenced("job_reclaim_expired"), "FOR UPDATE SKIP LOCKED")

    rows, new_token = _race(conn, db_url, other_worker, job_id, no_lock_no_fence)

    assert [r[0] for r in rows] == [job_id]
    row = job_row(conn, job_id)
    # The other worker's live attempt (lease a minute ahead) was taken from it.
    assert row["attempt_token"] is None and row["attempt_token"] != new_token
    assert (row["status"], row["reclaim_count"]) == ("queued", 1)
