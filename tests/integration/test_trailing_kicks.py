"""Trailing-edge kicks (pgdrain.aws.control): every enqueue followed by kick() is followed by a
run that claims after the enqueue committed. The race of the leading-edge debounce, reproduced
with a barrier: a job is enqueued and kicked while the kicked run sits between its last empty
claim and its exit; the kick is suppressed (the window is open). With the trailing edge the run
drains again and the next kick after its exit invokes; the control (the same timeline, the
trailing edge off: the debounce of before) leaves the job waiting for the schedule."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    FUNCTION_NAME,
    InvokeSpy,
)
from helpers.fixtures import wait_for
from helpers.ledger_jobs import jobs as registry
from helpers.lock_waits import someone_here_waits_on_a_lock
from pgdrain import Budget, Settings, drain, enqueue
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.kick import kick
from pgdrain.aws.wake import Waker
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.runner.drain import DrainResult

Conn = psycopg.Connection[Any]
WINDOW_SECONDS = 3600.0  # the debounce window is open for the whole test
TIMEOUT = 30.0


KICK_SETTINGS = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=WINDOW_SECONDS)
RUN_SETTINGS = Settings(queues=("emails",), reserve_seconds=0.5)


def _control(
    run_id: str, budget: Budget, queues: tuple[str, ...] | None = ("emails",), **options: Any
) -> RunControl:
    """The control plane of a run that drains the emails queue (None: every queue) and makes
    no schedules."""
    return RunControl(
        events.Trigger("enqueue", queues),
        run_id,
        budget,
        waker=Waker(RUN_SETTINGS, None),
        **options,
    )


class HeldRun:
    """A drain in a thread that stops at its first exit check until released."""

    def __init__(
        self, db_url: str, trailing_edge: bool, queues: tuple[str, ...] | None = ("emails",)
    ) -> None:
        self.queues = queues
        self.at_exit = threading.Event()
        self.go = threading.Event()
        self.result: DrainResult | None = None
        self.error: BaseException | None = None
        budget = Budget.seconds(TIMEOUT)
        self.control = _control(
            "run-under-test",
            budget,
            queues,
            trailing_edge=trailing_edge,
            before_exit_check=self._pause,
        )
        self._thread = threading.Thread(target=self._drain, args=(db_url, budget))
        self._paused = False

    def _pause(self) -> None:
        if not self._paused:  # only the first time: the point of the race
            self._paused = True
            self.at_exit.set()
            assert self.go.wait(TIMEOUT)

    def _drain(self, db_url: str, budget: Budget) -> None:
        try:
            settings = dataclasses.replace(RUN_SETTINGS, queues=self.queues)
            self.result = drain(settings, budget, registry, db_url, hooks=self.control)
        except BaseException as exc:
            self.error = exc

    def start(self) -> HeldRun:
        self._thread.start()
        assert self.at_exit.wait(TIMEOUT), "the run never reached its exit check"
        return self

    def release(self) -> DrainResult:
        self.go.set()
        self._thread.join(TIMEOUT)
        assert self.error is None and self.result is not None
        return self.result


def _status(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT status FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("trailing_edge", [True, False], ids=["trailing-edge", "control-leading"])
def test_a_kick_suppressed_while_the_run_is_exiting_is_not_lost(
    db_url: str, conn: Conn, lambda_api: Any, spy: InvokeSpy, trailing_edge: bool
) -> None:
    # The kick that started the run: it invokes and opens the debounce window.
    assert kick(conn, ["emails"], settings=KICK_SETTINGS, client=lambda_api) == ("emails",)
    run = HeldRun(db_url, trailing_edge).start()  # its claim found nothing; now at its exit

    with conn.transaction():
        job_id = enqueue(conn, "noop", {}, queue="emails")
    suppressed = kick(conn, ["emails"], settings=KICK_SETTINGS, client=lambda_api)
    assert suppressed == ()  # inside the window: no second invocation, on both timelines
    result = run.release()

    assert len(spy.calls) == 1
    if trailing_edge:
        assert (result.done, run.control.drained_again) == (1, 1)
        assert _status(conn, job_id) == "done"
    else:  # the leading-edge debounce: the run exits, the job waits for the schedule
        assert (result.done, run.control.drained_again) == (0, 0)
        assert _status(conn, job_id) == "queued"

    # After the exit, the next kick invokes with the trailing edge; the control still
    # suppresses it for the rest of the window.
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    after = kick(conn, ["emails"], settings=KICK_SETTINGS, client=lambda_api)
    assert after == (("emails",) if trailing_edge else ())


@pytest.mark.parametrize("trailing_edge", [True, False], ids=["trailing-edge", "control-leading"])
def test_a_run_of_every_queue_drains_again_for_a_kick_of_any_queue(
    db_url: str, conn: Conn, lambda_api: Any, spy: InvokeSpy, trailing_edge: bool
) -> None:
    """The same race for a run of every queue (PGDRAIN_QUEUES unset): it holds every queue's
    kicks and its exit check reads them all, so a suppressed kick of another queue than the
    one that started it is seen."""
    assert kick(conn, ["emails"], settings=KICK_SETTINGS, client=lambda_api) == ("emails",)
    assert kick(conn, ["sms"], settings=KICK_SETTINGS, client=lambda_api) == ("sms",)
    run = HeldRun(db_url, trailing_edge, queues=None).start()

    with conn.transaction():
        job_id = enqueue(conn, "noop", {}, queue="sms")
    assert kick(conn, ["sms"], settings=KICK_SETTINGS, client=lambda_api) == ()
    result = run.release()

    assert len(spy.calls) == 2
    if trailing_edge:
        assert (result.done, run.control.drained_again) == (1, 1)
        assert _status(conn, job_id) == "done"
    else:
        assert (result.done, run.control.drained_again) == (0, 0)
        assert _status(conn, job_id) == "queued"


def test_a_ready_job_another_run_is_claiming_does_not_keep_a_run_draining(
    db_url: str, conn: Conn
) -> None:
    """The exit check counts only jobs it could claim (SKIP LOCKED): a job locked by another
    run's claim in progress is that run's, and this run exits instead of spinning."""
    with conn.transaction():
        job_id = enqueue(conn, "noop", {}, queue="emails")
    with psycopg.connect(db_url) as other:  # a claim in progress elsewhere holds the row
        other.execute("SELECT id FROM pgdrain.active_jobs WHERE id = %s FOR UPDATE", (job_id,))
        budget = Budget.seconds(TIMEOUT)
        control = _control(
            "run-a",
            budget,
        )
        result = drain(RUN_SETTINGS, budget, registry, db_url, queues=["emails"], hooks=control)
        other.rollback()
    assert (result.stop_reason, result.claimed, control.drained_again) == ("empty", 0, 0)
    assert _status(conn, job_id) == "queued"


def test_a_run_is_registered_while_it_runs_and_gone_after_it_exits(db_url: str, conn: Conn) -> None:
    budget = Budget.seconds(TIMEOUT)
    seen: list[Any] = []

    def look() -> None:
        seen.append(conn.execute("SELECT run_id, queues FROM pgdrain.runs").fetchall())

    control = _control(
        "run-b",
        budget,
        before_exit_check=look,
    )
    drain(RUN_SETTINGS, budget, registry, db_url, queues=["emails"], hooks=control)
    assert control.run_id.startswith("run-b#")  # its own registration (copies never share it)
    assert seen == [[(control.run_id, ["emails"])]]
    assert conn.execute("SELECT count(*) FROM pgdrain.runs").fetchone() == (0,)


def test_an_exit_forgets_the_rows_of_runs_long_dead(db_url: str, conn: Conn) -> None:
    store.run_register(conn, "died-long-ago", ["emails"], 0, 10)
    store.run_register(conn, "died-just-now", ["emails"], 0, 10)
    conn.execute(
        "UPDATE pgdrain.runs SET deadline = now() - interval '2 hours'"
        " WHERE run_id = 'died-long-ago'"
    )
    store.run_exit(conn, "another-run", ["emails"])
    rows = conn.execute("SELECT run_id FROM pgdrain.runs").fetchall()
    assert rows == [("died-just-now",)]


# -- a burst is one invocation: the run lingers while kicks keep coming -----------------------

LINGER_WINDOW = 30.0  # long enough that this test's own speed never closes it
BURST = 3  # enqueue+kick pairs that arrive after the run's first empty claim


class BurstWhileIdle:
    """The lingering run's sleeps, as the application's side of the timeline: each of the first
    BURST sleeps is an enqueue+kick arriving while the run has nothing to claim; the next moves
    the kicks a window into the past, as if a window passed with no kick (the run's clock is the
    database's, so the test moves the database's record of the kicks, not a wall clock)."""

    def __init__(self, conn: Conn, lambda_api: Any) -> None:
        self.conn = conn
        self.lambda_api = lambda_api
        self.sleeps: list[float] = []
        self.kicked: list[tuple[str, ...]] = []

    def __call__(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.kicked) < BURST:
            self.arrive()
        else:
            self.conn.execute(
                "UPDATE pgdrain.kicks SET requested_at = requested_at - make_interval(secs => %s)",
                (LINGER_WINDOW,),
            )

    def arrive(self) -> None:
        with self.conn.transaction():
            enqueue(self.conn, "noop", {}, queue="emails")
        self.kicked.append(
            kick(self.conn, ["emails"], settings=KICK_SETTINGS, client=self.lambda_api)
        )


@pytest.mark.parametrize("linger", [True, False], ids=["lingers", "control-exits-at-once"])
def test_a_burst_that_outlasts_the_drain_is_one_invocation(
    db_url: str, conn: Conn, lambda_api: Any, spy: InvokeSpy, linger: bool
) -> None:
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    assert kick(conn, ["emails"], settings=KICK_SETTINGS, client=lambda_api) == ("emails",)
    burst = BurstWhileIdle(conn, lambda_api)
    budget = Budget.seconds(2 * LINGER_WINDOW)
    control = _control(
        "run-c",
        budget,
        linger_window_s=LINGER_WINDOW if linger else 0.0,
        reserve_seconds=RUN_SETTINGS.reserve_seconds,
        sleep=burst,
    )
    result = drain(RUN_SETTINGS, budget, registry, db_url, queues=["emails"], hooks=control)
    while len(burst.kicked) < BURST:  # the control's run has exited: the burst comes after it
        burst.arrive()

    if linger:  # the run took the whole burst; every kick of it was suppressed
        assert (result.done, control.lingered, len(burst.sleeps)) == (
            1 + BURST,
            BURST + 1,
            BURST + 1,
        )
        assert burst.kicked == [()] * BURST
        assert len(spy.calls) == 1
    else:  # the run exited after its one job: the burst's first kick starts another run
        assert (result.done, control.lingered, burst.sleeps) == (1, 0, [])
        assert burst.kicked == [("emails",)] + [()] * (BURST - 1)
        assert len(spy.calls) == 2
    assert conn.execute("SELECT count(*) FROM pgdrain.runs").fetchone() == (0,)  # it exited


# -- a live run holds its queues' kicks -------------------------------------------------------

NO_WINDOW = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)


def _enqueue_and_kick(conn: Conn, lambda_api: Any) -> tuple[str, ...]:
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    return kick(conn, ["emails"], settings=NO_WINDOW, client=lambda_api)


def _run_until(conn: Conn) -> Any:
    row = conn.execute("SELECT run_until FROM pgdrain.kicks WHERE queue = 'emails'").fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("held", [True, False], ids=["a-run-drains-the-queue", "control-no-run"])
def test_a_kick_does_not_invoke_while_a_run_drains_its_queue(
    conn: Conn, lambda_api: Any, spy: InvokeSpy, held: bool
) -> None:
    """No debounce window at all: only the live run's hold suppresses the kick (its exit check
    sees the job, as the trailing-edge test above shows)."""
    if held:
        store.run_register(conn, "live", ["emails"], 0, 60, hold_seconds=30)
    assert _enqueue_and_kick(conn, lambda_api) == (() if held else ("emails",))
    assert len(spy.calls) == (0 if held else 1)


def test_a_run_that_exited_or_stopped_renewing_holds_no_kick(
    conn: Conn, lambda_api: Any, spy: InvokeSpy
) -> None:
    store.run_register(conn, "exits", ["emails"], 0, 60, hold_seconds=30)
    store.run_exit(conn, "exits", ["emails"])
    assert _enqueue_and_kick(conn, lambda_api) == ("emails",)

    # A run killed (or busy with long jobs, claiming nothing) renews nothing: its hold lapses.
    store.run_register(conn, "killed", ["emails"], 0, 60, hold_seconds=30)
    assert _enqueue_and_kick(conn, lambda_api) == ()
    conn.execute("UPDATE pgdrain.kicks SET run_until = now() - interval '1 second'")
    assert _enqueue_and_kick(conn, lambda_api) == ("emails",)
    assert len(spy.calls) == 2


def test_the_hold_never_outlasts_the_run(conn: Conn) -> None:
    store.run_register(conn, "short", ["emails"], 0, remaining_seconds=5, hold_seconds=3600)
    row = conn.execute(
        "SELECT k.run_until = r.deadline FROM pgdrain.kicks AS k, pgdrain.runs AS r"
        " WHERE k.queue = 'emails' AND r.run_id = 'short'"
    ).fetchone()
    assert row == (True,)


def test_a_claiming_run_renews_its_hold_at_half_the_hold(db_url: str, conn: Conn) -> None:
    now = [0.0]
    budget = Budget.seconds(TIMEOUT)
    control = _control(
        "run-d",
        budget,
        kick_hold_s=10.0,
        clock=lambda: now[0],
    )
    session = Session(db_url, RUN_SETTINGS, budget)
    session.open()
    try:
        control.after_connect(session)
        session.run(store.job_reclaim_expired, 10)  # the drain's first statement carries it
        first = _run_until(conn)
        now[0] = 4.9
        control.after_round_trip(session, {}, 4.9)  # not yet half the hold: nothing written
        assert _run_until(conn) == first
        now[0] = 5.0
        control.after_round_trip(session, {}, 5.0)
        assert _run_until(conn) > first
    finally:
        session.close()


@pytest.mark.parametrize("hold", [30.0, 0.0], ids=["held-from-the-invoke", "control-no-hold"])
def test_kicks_before_the_invoked_run_registers_start_no_other_run(conn: Conn, hold: float) -> None:
    """No debounce window: the second kick comes while the first one's run is still starting
    (not registered yet). The invoking kick's hold makes it that run's; without it, a second
    run starts for the same job."""
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    first = store.kick_debounce(conn, ["emails"], 0.0, hold_seconds=hold).invoke
    second = store.kick_debounce(conn, ["emails"], 0.0, hold_seconds=hold).invoke
    assert (first, second) == (["emails"], [] if hold else ["emails"])


def test_the_hold_comes_from_a_third_of_a_lease() -> None:
    from pgdrain.aws.kick import kick_hold_seconds

    assert kick_hold_seconds(Settings(lease_seconds=30)) == 10


@pytest.mark.parametrize("woken", [True, False], ids=["wakes-for-the-kick", "control-ready-only"])
def test_a_run_stopped_for_time_wakes_for_a_kick_it_held_back(
    db_url: str,
    conn: Conn,
    other: Conn,
    lambda_api: Any,
    spy: InvokeSpy,
    woken: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A red team's finding: a run stopped for time holds its queues' kicks; a job enqueued and
    kicked while its exit waits for the lock on another queue's kick row is not ready in the
    exit's snapshot, and its kick invoked nothing (the run held it). The exit says `kicked`,
    which the end of a run stopped for time did not read: no wake-up, the job left to the
    hourly schedule. The control reads `ready` alone, as before."""
    if not woken:
        real = store.run_exit
        monkeypatch.setattr(
            store,
            "run_exit",
            lambda *a, **k: dataclasses.replace(real(*a, **k), kicked=False),
        )
    conn.execute(
        "INSERT INTO pgdrain.kicks (queue, kicked_at, requested_at, run_until)"
        " VALUES ('a', now(), now(), now() + interval '1 hour'),"
        " ('b', now(), now(), now() + interval '1 hour')"  # the run holds both
    )
    budget = Budget.seconds(TIMEOUT)
    control = _control("run-under-test", budget, ("a", "b"))
    session = Session(db_url, dataclasses.replace(RUN_SETTINGS, queues=("a", "b")), budget)
    session.open()
    try:
        ended = threading.Thread(target=control.after_budget, args=(session, False))
        with other.transaction():  # another kick of `a`, not yet committed: the exit waits
            other.execute("SELECT 1 FROM pgdrain.kicks WHERE queue = 'a' FOR UPDATE")
            ended.start()
            wait_for(lambda: someone_here_waits_on_a_lock(conn), TIMEOUT, "the exit waits")
            with conn.transaction():
                job_id = enqueue(conn, "noop", {}, queue="b")
            assert kick(conn, ["b"], settings=KICK_SETTINGS, client=lambda_api) == ()  # held
        ended.join(TIMEOUT)
    finally:
        session.close()
    assert spy.calls == [] and _status(conn, job_id) == "queued"
    # Waker(…, None) makes no schedule: "reported" is the wake-up it would make.
    assert control.wake.action == ("reported" if woken else "none")
