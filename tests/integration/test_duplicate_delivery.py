"""A fan-out event delivered twice (Lambda's async delivery is at least once). Each invocation
registers in pgdrain.runs under an id of its own, and a fan-out run takes up the place its
spawner reserved once (store.run_admit, under the fan-out gate): a copy of its event drains only
while fewer than PGDRAIN_MAX_RUNS runs are live, and its exit never ends the first copy's
registration. Reproduced with a replayed event: the handler invoked twice with the same event
and the same request id, the copy arriving while the first copy's job holds it mid-drain (a
gate the test opens). The control is the same timeline with the registration of before, both
copies under the event's id (Controls(register_each_invocation=False))."""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers import gate_jobs
from helpers.aws import (
    REGION,
    InvokeSpy,
    aws_environment,
    create_function,
    handler_env,
    invoke_handler,
    mocked_aws,
)
from helpers.fixtures import wait_for
from helpers.lock_waits import waits_on_a_lock
from pgdrain import enqueue
from pgdrain.aws import events
from pgdrain.aws import run as lambda_run
from pgdrain.aws.control import RunControl
from pgdrain.aws.lambda_api import lambda_client
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]

MAX_RUNS = 3
TIMEOUT = 30.0
REQUEST_ID = "0f6c2a9e-replayed"  # Lambda may deliver a copy with the first one's request id
SHARED_ID = Controls(register_each_invocation=False)


def _live_runs(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT run_id FROM pgdrain.runs WHERE deadline > now() ORDER BY 1")
    return [str(r[0]) for r in rows.fetchall()]


def _places_left(conn: Conn) -> int:
    """How many runs a spawner deciding now would start (its reservations rolled back)."""
    reserved: list[str] = []
    with conn.transaction() as tx:
        reserved = store.run_spawn(conn, str(uuid.uuid4()), ["default"], 1, 100, MAX_RUNS, 60)
        raise psycopg.Rollback(tx)
    return len(reserved)


def _registered_each(monkeypatch: pytest.MonkeyPatch, each: bool) -> None:
    """The handler's runs register as the product does, or (the control) as before."""
    if not each:
        control = functools.partial(RunControl, controls=SHARED_ID)
        monkeypatch.setattr(lambda_run, "RunControl", control)


class Invocation:
    """One invocation of the handler in a thread of its own (its jobs may hold it)."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._invoke, args=(event,))
        self._thread.start()

    def _invoke(self, event: dict[str, Any]) -> None:
        try:
            self.result = invoke_handler(event, remaining_s=TIMEOUT, request_id=REQUEST_ID)
        except BaseException as exc:  # reported by outcome()
            self.error = exc

    def outcome(self) -> dict[str, Any]:
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive(), "the invocation never returned"
        assert self.error is None and self.result is not None, self.error
        return self.result


@pytest.fixture
def handler(monkeypatch: pytest.MonkeyPatch, db_url: str) -> Iterator[InvokeSpy]:
    """The function's handler against this test's database, with moto's Lambda; one job at a
    time per run (so each copy holds one gate job), and runs that spawn none themselves."""
    aws_environment(monkeypatch)
    handler_env(
        monkeypatch,
        DATABASE_URL=db_url,
        PGDRAIN_JOBS="helpers.gate_jobs",
        PGDRAIN_MAX_RUNS=str(MAX_RUNS),
        PGDRAIN_CONCURRENCY="1",
        PGDRAIN_BATCH_SIZE="1",
        PGDRAIN_MAX_CHAIN="1",  # the fan-out events below are hop 1: no further fan-out
    )
    try:
        with mocked_aws():
            create_function()
            spy = InvokeSpy()
            spy.attach(lambda_client(REGION))
            yield spy
    finally:
        gate_jobs.reset()


@pytest.mark.parametrize("each", [True, False], ids=["own-registration", "control-shared-id"])
def test_a_fanout_event_delivered_twice_keeps_the_cap_and_the_first_registration(
    conn: Conn, handler: InvokeSpy, monkeypatch: pytest.MonkeyPatch, each: bool
) -> None:
    _registered_each(monkeypatch, each)
    # Two live runs (the spawner and another) and the place the spawner reserved: 3 of 3.
    for name in ("spawner", "another"):
        store.run_register(conn, name, ["default"], 0, 300)
    (reserved,) = store.run_spawn(conn, str(uuid.uuid4()), ["default"], 1, MAX_RUNS, MAX_RUNS, 60)
    with conn.transaction():
        first_job = enqueue(conn, "wait_at_gate", {})
        second_job = enqueue(conn, "wait_at_gate", {})
    event = events.fanout_event(["default"], 1, reserved)

    original = Invocation(event)
    assert gate_jobs.next_held() == first_job  # the first copy is mid-drain
    copy = Invocation(event)  # the same event again, with the same request id

    if each:
        refused = copy.outcome()
        assert refused["ok"] is True, refused
        assert (refused["result"]["stop_reason"], refused["result"]["claimed"]) == ("at_cap", 0)
        live = _live_runs(conn)
        assert len(live) == MAX_RUNS and reserved not in live  # the place was taken up, once
        assert _places_left(conn) == 0  # 3 runs drain, 3 are counted
        gate_jobs.release(first_job)
        assert gate_jobs.next_held() == second_job  # the first copy drains what is left
        gate_jobs.release(second_job)
        assert original.outcome()["result"]["done"] == 2
    else:
        assert gate_jobs.next_held() == second_job  # the copy drains too: 4 runs at once...
        assert _live_runs(conn) == sorted(["another", reserved, "spawner"])  # ...3 counted
        gate_jobs.release(second_job)
        assert copy.outcome()["result"]["done"] == 1
        # The copy's exit ended the registration the first copy still drains under: a spawner
        # deciding now starts a fourth run beside the three that drain.
        assert _live_runs(conn) == ["another", "spawner"]
        assert _places_left(conn) == 1
        gate_jobs.release(first_job)
        assert original.outcome()["result"]["done"] == 1
    assert _live_runs(conn) == ["another", "spawner"]  # the copies' registrations are gone
    assert [e for e in handler.events() if e["pgdrain"]["reason"] == "fanout"] == []


@pytest.mark.parametrize("each", [True, False], ids=["own-registration", "control-shared-id"])
def test_a_kick_delivered_twice_never_ends_the_first_copys_registration(
    conn: Conn, handler: InvokeSpy, monkeypatch: pytest.MonkeyPatch, each: bool
) -> None:
    """Not a fan-out event: no reservation and no cap, but the same request id, so before each
    invocation had an id of its own both copies registered as one run."""
    _registered_each(monkeypatch, each)
    with conn.transaction():
        first_job = enqueue(conn, "wait_at_gate", {})
        second_job = enqueue(conn, "wait_at_gate", {})
    event = events.enqueue_event(["default"])

    original = Invocation(event)
    assert gate_jobs.next_held() == first_job
    copy = Invocation(event)
    assert gate_jobs.next_held() == second_job  # both copies drain (no cap for a kicked run)
    assert len(_live_runs(conn)) == (2 if each else 1)
    gate_jobs.release(second_job)
    assert copy.outcome()["result"]["done"] == 1

    # While the first copy still drains: registered, or (the control) forgotten.
    assert len(_live_runs(conn)) == (1 if each else 0)
    gate_jobs.release(first_job)
    assert original.outcome()["result"]["done"] == 1
    assert _live_runs(conn) == []


# -- run_admit, the statement ---------------------------------------------------------------------


def test_a_fanout_run_takes_up_its_reservation_once(conn: Conn) -> None:
    store.run_register(conn, "spawner", ["default"], 0, 300)
    (reserved,) = store.run_spawn(conn, str(uuid.uuid4()), ["default"], 1, 2, 2, 60)

    assert store.run_admit(conn, "first#a", reserved, ["default"], 1, 300, 2)
    assert _live_runs(conn) == ["first#a", "spawner"]  # the reservation became the run
    # Its statement again (a retry after a lost reply): admitted, nothing more taken.
    assert store.run_admit(conn, "first#a", reserved, ["default"], 1, 300, 2)
    assert _live_runs(conn) == ["first#a", "spawner"]
    # A copy of its event: the place is taken and the cap reached.
    assert not store.run_admit(conn, "copy#b", reserved, ["default"], 1, 300, 2)
    assert _live_runs(conn) == ["first#a", "spawner"]
    # Below the cap, a copy (or a late start, or Lambda's retry) drains as one more run.
    assert store.run_admit(conn, "copy#c", reserved, ["default"], 1, 300, 3)
    assert _live_runs(conn) == ["copy#c", "first#a", "spawner"]


def test_a_lapsed_reservation_counts_for_nothing(conn: Conn) -> None:
    (reserved,) = store.run_spawn(conn, str(uuid.uuid4()), ["default"], 1, 1, 1, 60)
    conn.execute("UPDATE pgdrain.runs SET deadline = now() - interval '1 second'")
    assert store.run_admit(conn, "late#a", reserved, ["default"], 1, 300, 1)
    assert not store.run_admit(conn, "late#b", reserved, ["default"], 1, 300, 1)


@pytest.mark.parametrize("gate", [True, False], ids=["gate", "control-no-gate"])
def test_two_copies_admitted_at_once_keep_the_cap(db_url: str, conn: Conn, gate: bool) -> None:
    """Both copies arrive when the reservation has lapsed and one place is left; the second
    decides while the first is uncommitted. Under the gate it waits and finds the cap reached;
    without it (the control) it counts before the first's row is visible."""
    store.run_register(conn, "live", ["default"], 0, 300)
    params = {"reserved": "lapsed", "max_runs": 2}
    first = psycopg.connect(db_url, autocommit=True)
    second = psycopg.connect(db_url, autocommit=True)
    second_pid = second.info.backend_pid
    admitted: dict[str, bool] = {}

    def admit(c: Conn, run_id: str) -> None:
        with c.transaction():
            if gate:
                store.run_gate_lock(c)
            row = c.execute(query("run_admit"), params | {"run_id": run_id}).fetchone()
            admitted[run_id] = bool(row and row[0])
            if admitted[run_id]:
                _register(c, run_id)

    try:
        with first.transaction():
            if gate:
                store.run_gate_lock(first)
            row = first.execute(query("run_admit"), params | {"run_id": "one"}).fetchone()
            admitted["one"] = bool(row and row[0])
            _register(first, "one")
            thread = threading.Thread(target=admit, args=(second, "two"))
            thread.start()
            if gate:
                wait_for(lambda: waits_on_a_lock(conn, second_pid), what="the gate wait")
            else:
                thread.join(TIMEOUT)
        thread.join(TIMEOUT)
    finally:
        first.close()
        second.close()

    assert admitted["one"] is True
    if gate:
        assert (admitted["two"], len(_live_runs(conn))) == (False, 2)
    else:
        assert (admitted["two"], len(_live_runs(conn))) == (True, 3)  # the cap is broken


def _register(c: Conn, run_id: str) -> None:
    """The runs row alone (run_register also holds the queue's kick row, which the control's
    second copy would wait on)."""
    c.execute(
        "INSERT INTO pgdrain.runs (run_id, queues, chain, deadline)"
        " VALUES (%s, '{default}', 1, now() + interval '5 minutes')",
        (run_id,),
    )
