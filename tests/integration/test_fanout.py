"""Fan-out (pgdrain.aws.fanout): a run that cannot finish the ready work in its budget starts
more runs, up to PGDRAIN_MAX_RUNS live runs in all, counted in pgdrain.runs; decisions
serialise on the run_gate row lock. The race without the lock is reproduced deterministically
(the second decision is made while the first is uncommitted), beside the same timeline with it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest

import jobs as example_jobs
from helpers import lossy_proxy
from helpers.aws import (
    InvokeSpy,
    aws_environment,
    create_function,
    invoke_handler,
    mocked_aws,
)
from helpers.fixtures import wait_for
from helpers.lock_waits import waits_on_a_lock
from helpers.lossy_proxy import LossyProxy
from pgdrain import Budget, Settings, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.aws import events
from pgdrain.aws.fanout import (
    MEASURE_JOBS_PER_SLOT,
    Invoke,
    Spawner,
    runs_needed,
    useful_runs,
)
from pgdrain.aws.lambda_api import lambda_client
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.db.sql import query
from pgdrain.runner.drain import DrainResult, drain_with
from pgdrain.runner.summary import Counter
from pgdrain.settings import ENV_VARIABLES

Conn = psycopg.Connection[Any]


def _live_runs(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgdrain.runs WHERE deadline > now()").fetchone()
    assert row is not None
    return int(row[0])


def _spawn_params(runs_needed: int, max_runs: int) -> dict[str, Any]:
    return {
        "spawn_id": str(uuid.uuid4()),
        "queues": ["default"],
        "chain": 1,
        "runs_needed": runs_needed,
        "max_runs": max_runs,
        "reserve_seconds": 60,
    }


# -- the arithmetic -----------------------------------------------------------------------------


def test_runs_needed() -> None:
    assert runs_needed(100, 10.0, 20.0, 20.0) == 1  # this run finishes alone
    assert runs_needed(1000, 10.0, 20.0, 20.0) == 5  # 200 here, 800 / 200 per new run
    assert runs_needed(1000, 10.0, 1.0, 20.0) == 6  # near its end: 10 here, 990 / 200
    assert runs_needed(1000, 0.0, 20.0, 20.0) == 1  # nothing measured yet: no decision
    # Within a horizon shorter than the budget: every run does its share in it.
    assert runs_needed(100, 10.0, 20.0, 20.0, horizon_seconds=5.0) == 2  # 50 each in 5 s
    assert runs_needed(50, 10.0, 20.0, 20.0, horizon_seconds=5.0) == 1  # done within it alone
    assert runs_needed(1000, 10.0, 1.0, 20.0, horizon_seconds=5.0) == 6  # the budget binds


def test_limited_queues_want_no_more_runs_than_their_slots() -> None:
    limited = Settings(queues=("emails", "sms"), concurrency=4, queue_limits=(("emails", 2),))
    assert useful_runs(limited, ("emails",)) == 1  # 2 slots: one run of 4 fills them
    assert useful_runs(limited, ("emails", "sms")) == 10  # sms is not limited
    wide = Settings(concurrency=2, queue_limits=(("default", 7),))
    assert useful_runs(wide, ("default",)) == 4


# -- the cap under concurrent decisions ----------------------------------------------------------


@pytest.mark.parametrize("gate", [True, False], ids=["gate", "control-no-gate"])
def test_two_decisions_at_once_keep_the_cap(db_url: str, conn: Conn, gate: bool) -> None:
    cap = 4
    for name in ("live-1", "live-2"):
        store.run_register(conn, name, ["default"], 0, 300)
    first = psycopg.connect(db_url, autocommit=True)
    second = psycopg.connect(db_url, autocommit=True)
    second_pid = second.info.backend_pid
    reserved: dict[str, int] = {}

    def decide_second() -> None:
        with second.transaction():
            if gate:
                store.run_gate_lock(second)
            rows = second.execute(query("run_spawn"), _spawn_params(10, cap)).fetchall()
            reserved["second"] = len(rows)

    try:
        with first.transaction():
            if gate:
                store.run_gate_lock(first)
            rows = first.execute(query("run_spawn"), _spawn_params(10, cap)).fetchall()
            reserved["first"] = len(rows)
            # The second decision is made while the first is not committed yet.
            thread = threading.Thread(target=decide_second)
            thread.start()
            if gate:  # it waits on the gate until the first commits
                wait_for(lambda: waits_on_a_lock(conn, second_pid), what="the gate wait")
            else:  # nothing holds it back: it counts before the first's rows are visible
                thread.join(10)
        thread.join(10)
    finally:
        first.close()
        second.close()

    assert reserved["first"] == 2
    if gate:
        assert (reserved["second"], _live_runs(conn)) == (0, cap)
    else:
        assert (reserved["second"], _live_runs(conn)) == (2, cap + 2)  # the cap is broken


def test_many_runs_deciding_at_once_never_exceed_the_cap(db_url: str, conn: Conn) -> None:
    runs, cap = 8, 10
    barrier = threading.Barrier(runs)
    reserved: list[int] = []
    errors: list[BaseException] = []
    settings = Settings()

    def one(i: int) -> None:
        try:
            session = Session(db_url, settings, Budget.seconds(30))
            session.open()
            try:
                session.run(store.run_register, f"run-{i}", ["default"], 0, 300)
                barrier.wait()
                ids = session.run(store.run_spawn, str(uuid.uuid4()), ["default"], 1, 100, cap, 60)
                reserved.append(len(ids))
            finally:
                session.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _live_runs(conn) <= cap
    assert sum(reserved) <= cap - runs


@pytest.mark.parametrize("same_id", [True, False], ids=["found-again", "control-new-id"])
def test_a_spawn_whose_reply_is_lost_returns_its_reservations_when_sent_again(
    conn: Conn, proxy: LossyProxy, same_id: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's finding: the reservations committed, their reply lost, the session sent
    the spawn again, which counted them as live runs, reserved nothing and invoked nobody: the
    cap stayed full for a minute with no run behind it. The control: each try a new id, as the
    spawn was before it had one."""
    # The spawn is a transaction of its own (BEGIN, the statement, COMMIT): the reply lost is
    # the COMMIT's, not the one after the statement's Sync, which the client waits for.
    monkeypatch.setattr(lossy_proxy, "SYNC", b"no Sync ends this transaction")
    session = Session(proxy.url, Settings(), Budget.seconds(60))
    session.open()
    try:
        spawn = (
            store.run_spawn
            if same_id
            else lambda c, _id, *rest: store.run_spawn(c, str(uuid.uuid4()), *rest)
        )
        proxy.drop_commit_reply(b"generate_series(")
        reserved = session.run(spawn, str(uuid.uuid4()), ["default"], 1, 4, 4, 60)
    finally:
        session.close()
    assert proxy.dropped.is_set()
    live = [r[0] for r in conn.execute("SELECT run_id FROM pgdrain.runs WHERE deadline > now()")]
    assert len(live) == 4  # the first try's, committed
    assert sorted(reserved) == (sorted(live) if same_id else [])


def test_a_run_past_its_deadline_does_not_count(conn: Conn) -> None:
    store.run_register(conn, "killed", ["default"], 0, 300)
    conn.execute("UPDATE pgdrain.runs SET deadline = now() - interval '1 second'")
    assert len(store.run_spawn(conn, str(uuid.uuid4()), ["default"], 1, 3, 3, 60)) == 3


# -- through the handler --------------------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch, db_url: str) -> Iterator[InvokeSpy]:
    aws_environment(monkeypatch)
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", db_url)
    with mocked_aws():
        create_function()
        recorder = InvokeSpy()
        recorder.attach(lambda_client("us-east-1"))  # the client invoke_async uses
        yield recorder


def test_a_backlog_fans_out_up_to_the_cap_with_the_hop_count(
    conn: Conn, spy: InvokeSpy, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "PGDRAIN_MAX_RUNS": "4",
        "PGDRAIN_CONCURRENCY": "2",
        "PGDRAIN_RESERVE_SECONDS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with conn.transaction():
        enqueue_many(conn, [build_job("sleep", {"seconds": 0.05}) for _ in range(400)])

    result = invoke_handler(events.continue_event(["default"], 2), remaining_s=3.5)

    assert result["ok"] is True, result
    spawned = [e for e in spy.events() if e["pgdrain"]["reason"] == "fanout"]
    assert result["spawned"] == len(spawned) == 3  # 4 runs in all, this one included
    assert {e["pgdrain"]["chain"] for e in spawned} == {3}  # the hop count goes on
    ids = {e["pgdrain"]["run"] for e in spawned}
    rows = conn.execute(
        "SELECT run_id, chain FROM pgdrain.runs WHERE run_id = ANY(%s)", (list(ids),)
    )
    assert sorted(r[1] for r in rows.fetchall()) == [3, 3, 3]  # reserved until they start

    # A spawned run takes up its reserved place (under an id of its own, with its own
    # deadline), and whatever it spawns keeps the live runs within the cap.
    event = spawned[0]
    run_id = event["pgdrain"]["run"]
    trigger = events.parse(event, Settings())
    assert (trigger.reason, trigger.chain, trigger.run_id) == ("fanout", 3, run_id)
    before = len(spy.calls)
    second = invoke_handler(event, remaining_s=2.5)
    assert second["ok"] is True and second["trigger"] == "fanout"
    assert second["result"]["stop_reason"] != "at_cap"
    row = conn.execute("SELECT count(*) FROM pgdrain.runs WHERE run_id = %s", (run_id,))
    assert row.fetchone() == (0,)  # the reservation is gone: taken up
    more = [e for e in spy.events()[before:] if e["pgdrain"]["reason"] == "fanout"]
    assert {e["pgdrain"]["chain"] for e in more} <= {4}
    assert _live_runs(conn) <= 4


@pytest.mark.parametrize(("horizon", "spawned"), [("0.5", 2), ("0", 0)], ids=["horizon", "budget"])
def test_work_that_would_outlast_the_horizon_fans_out_though_the_budget_suffices(
    conn: Conn, spy: InvokeSpy, monkeypatch: pytest.MonkeyPatch, horizon: str, spawned: int
) -> None:
    """About 2.5 s of work (100 jobs of 50 ms, 2 at a time) in a 30 s budget: one run would
    finish it alone, so with no horizon (PGDRAIN_FANOUT_SECONDS=0, the control) nothing is
    started; with a horizon of 0.5 s the run starts the most runs the cap allows."""
    for name, value in {
        "PGDRAIN_MAX_RUNS": "3",
        "PGDRAIN_CONCURRENCY": "2",
        "PGDRAIN_RESERVE_SECONDS": "1",
        "PGDRAIN_FANOUT_SECONDS": horizon,
    }.items():
        monkeypatch.setenv(name, value)
    with conn.transaction():
        enqueue_many(conn, [build_job("sleep", {"seconds": 0.05}) for _ in range(100)])

    result = invoke_handler(events.continue_event(["default"], 1), remaining_s=30.0)

    assert result["ok"] is True, result
    assert result["result"]["done"] == 100  # the spawned runs are only recorded: it drains all
    assert result["spawned"] == spawned
    assert len([e for e in spy.events() if e["pgdrain"]["reason"] == "fanout"]) == spawned


@pytest.mark.parametrize("finished", [10, 9], ids=["measured", "too-few-to-measure"])
def test_the_first_decision_comes_once_each_slot_has_finished_a_few_jobs(
    db_url: str, conn: Conn, finished: int
) -> None:
    """No time passes (an injected clock): the first decision does not wait its second once
    every slot has finished MEASURE_JOBS_PER_SLOT jobs (2 slots: 10 jobs); one job fewer (the
    control), and it waits. 400 jobs at the measured 20 a second outlast the 10 s horizon."""
    settings = Settings(concurrency=2, max_runs=3, reserve_seconds=1.0)
    assert MEASURE_JOBS_PER_SLOT * settings.concurrency == 10
    with conn.transaction():
        enqueue_many(conn, [build_job("sleep", {"seconds": 0.05}) for _ in range(400)])
    invoked: list[dict[str, Any]] = []
    budget = Budget.seconds(60)
    spawner = Spawner(
        settings,
        events.Trigger("enqueue", ("default",)),
        budget,
        "arn:aws:lambda:us-east-1:123456789012:function:drain",
        lambda _arn, event: invoked.append(event),
        clock=lambda: 0.0,
    )
    session = Session(db_url, settings, budget)
    session.open()
    try:
        spawner.after_round_trip(session, {"done": finished}, 0.5)
    finally:
        spawner.close()
        session.close()

    assert bool(invoked) is (finished == 10)  # runs started (this test's run is not registered)


def test_a_run_at_the_hop_limit_does_not_fan_out(
    conn: Conn, spy: InvokeSpy, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "PGDRAIN_MAX_CHAIN": "2",
        "PGDRAIN_CONCURRENCY": "2",
        "PGDRAIN_RESERVE_SECONDS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with conn.transaction():
        enqueue_many(conn, [build_job("sleep", {"seconds": 0.05}) for _ in range(400)])

    result = invoke_handler(events.fanout_event(["default"], 2, "at-the-limit"), remaining_s=3.0)

    assert result["ok"] is True, result
    assert result["spawned"] == 0
    assert [e for e in spy.events() if e["pgdrain"]["reason"] == "fanout"] == []


# -- the run's leases while it starts runs ------------------------------------------------------

INVOKE_S = 3.0  # one invoke of a slow Lambda API (throttled, retried): twice the leases
LEASE_S = 1.5
ARN = "arn:aws:lambda:us-east-1:123456789012:function:drain"


class _Spawning:
    """The run's hooks: fan-out alone (as control.py calls it after each claim)."""

    def __init__(self, spawner: Spawner) -> None:
        self._spawner = spawner

    def after_connect(self, session: Session) -> bool:
        return True

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        self._spawner.after_round_trip(session, counts, elapsed_s)

    def before_exit(self, session: Session) -> bool:
        self._spawner.settle(session)
        return False


def _drain_fanning_out(
    db_url: str,
    settings: Settings,
    budget: Budget,
    invoke: Invoke,
    controls: Controls = ALL_ON,
    **spawner_options: Any,
) -> tuple[DrainResult, Spawner]:
    """A drain of the default queue whose only hooks are fan-out's, invoking with `invoke`;
    the invokes under way have ended when it returns."""
    trigger = events.Trigger("enqueue", ("default",))
    spawner = Spawner(settings, trigger, budget, ARN, invoke, controls=controls, **spawner_options)
    try:
        hooks = _Spawning(spawner)
        return drain_with(
            controls, settings, budget, example_jobs.jobs, db_url, hooks=hooks
        ), spawner
    finally:
        spawner.close()


@pytest.mark.parametrize(
    "off_the_run_thread", [True, False], ids=["invoked-off-the-run-thread", "control-inline"]
)
def test_a_slow_invoke_while_fanning_out_does_not_let_the_leases_lapse(
    db_url: str, conn: Conn, off_the_run_thread: bool
) -> None:
    """One invoke takes 3 s, twice the run's 1.5 s leases. As it ends, another run starts and
    reclaims what has expired, as a spawned run's first statement does. Invoked from a thread of
    its own, the run's heartbeat went on meanwhile: nothing has expired and no job runs twice.
    Invoked on the run's thread (the control), the jobs the run holds are reclaimed under it."""
    settings = Settings(concurrency=2, max_runs=2, reserve_seconds=1.0, lease_seconds=LEASE_S)
    with conn.transaction():
        enqueue_many(conn, [build_job("sleep", {"seconds": 0.3}) for _ in range(300)])
    budget = Budget.seconds(7.0)
    invoked: list[dict[str, Any]] = []
    held: list[int] = []
    reclaimed: list[store.Reclaimed] = []

    def slow_invoke(_arn: str, event: dict[str, Any]) -> None:
        invoked.append(event)
        if len(invoked) > 1:
            return  # max_runs 2 reserves two runs (this test's run is not registered)
        time.sleep(INVOKE_S)
        with psycopg.connect(db_url, autocommit=True) as another_run:
            row = another_run.execute(
                "SELECT count(*) FROM pgdrain.jobs WHERE status = 'running'"
            ).fetchone()
            assert row is not None
            held.append(row[0])
            reclaimed.extend(store.job_reclaim_expired(another_run, 100))

    # One decision (no time passes): once each slot has finished a few jobs.
    result, spawner = _drain_fanning_out(
        db_url,
        settings,
        budget,
        slow_invoke,
        Controls(invoke_off_the_run_thread=off_the_run_thread),
        clock=lambda: 0.0,
    )

    assert len(invoked) == 2 and held == [2], (invoked, held)  # the run held jobs then
    assert spawner.spawned == [event["pgdrain"]["run"] for event in invoked]
    if off_the_run_thread:
        assert (reclaimed, result.lease_lost) == ([], 0), result
    else:
        assert reclaimed and result.lease_lost == len(reclaimed), (reclaimed, result)


def test_a_run_whose_invoke_failed_leaves_the_cap(db_url: str, conn: Conn) -> None:
    """An invoke that fails (off the run's thread) is taken up on the run's: counted, logged,
    and its reservation unregistered before the run exits, so it holds no place in the cap."""
    settings = Settings(concurrency=2, max_runs=2, reserve_seconds=1.0)
    with conn.transaction():
        enqueue_many(conn, [build_job("sleep", {"seconds": 0.05}) for _ in range(400)])
    budget = Budget.seconds(3.0)
    counted: dict[str, int] = {}
    reserved_live: list[int] = []

    def failing_invoke(_arn: str, _event: dict[str, Any]) -> None:
        with psycopg.connect(db_url, autocommit=True) as other:
            reserved_live.append(_live_runs(other))
        raise RuntimeError("throttled")

    def count(name: str, n: int) -> None:
        counted[name] = counted.get(name, 0) + n

    _, spawner = _drain_fanning_out(db_url, settings, budget, failing_invoke, count=count)

    assert reserved_live and min(reserved_live) >= 1  # reserved while it was being invoked
    assert (spawner.spawned, counted) == ([], {"SpawnFailed": len(reserved_live)})
    assert _live_runs(conn) == 0
