"""Trailing-edge kicks (pgdrain.aws.control): every enqueue followed by kick() is followed by a
run that claims after the enqueue committed. The race of the leading-edge debounce, reproduced
with a barrier: a job is enqueued and kicked while the kicked run sits between its last empty
claim and its exit; the kick is suppressed (the window is open). With the trailing edge the run
drains again and the next kick after its exit invokes; the control (the same timeline, the
trailing edge off: the debounce of before) leaves the job waiting for the schedule."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    FUNCTION_NAME,
    InvokeSpy,
)
from helpers.ledger_jobs import jobs as registry
from pgdrain import Budget, Settings, drain, enqueue
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.kick import kick
from pgdrain.aws.wake import Waker
from pgdrain.drain import DrainResult

Conn = psycopg.Connection[Any]
WINDOW_SECONDS = 3600.0  # the debounce window is open for the whole test
TIMEOUT = 30.0


KICK_SETTINGS = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=WINDOW_SECONDS)
RUN_SETTINGS = Settings(queues=("emails",), reserve_seconds=0.5)


class HeldRun:
    """A drain in a thread that stops at its first exit check until released."""

    def __init__(self, db_url: str, trailing_edge: bool) -> None:
        self.at_exit = threading.Event()
        self.go = threading.Event()
        self.result: DrainResult | None = None
        self.error: BaseException | None = None
        budget = Budget.seconds(TIMEOUT)
        self.control = RunControl(
            events.Trigger("enqueue", ("emails",)),
            "run-under-test",
            budget,
            waker=Waker(RUN_SETTINGS, None),
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
            self.result = drain(
                RUN_SETTINGS, budget, registry, db_url, queues=["emails"], hooks=self.control
            )
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


def test_a_ready_job_another_run_is_claiming_does_not_keep_a_run_draining(
    db_url: str, conn: Conn
) -> None:
    """The exit check counts only jobs it could claim (SKIP LOCKED): a job locked by another
    run's claim in progress is that run's, and this run exits instead of spinning."""
    with conn.transaction():
        job_id = enqueue(conn, "noop", {}, queue="emails")
    with psycopg.connect(db_url) as other:  # a claim in progress elsewhere holds the row
        other.execute("SELECT id FROM pgdrain.jobs WHERE id = %s FOR UPDATE", (job_id,))
        budget = Budget.seconds(TIMEOUT)
        control = RunControl(
            events.Trigger("enqueue", ("emails",)),
            "run-a",
            budget,
            waker=Waker(RUN_SETTINGS, None),
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

    control = RunControl(
        events.Trigger("enqueue", ("emails",)),
        "run-b",
        budget,
        waker=Waker(RUN_SETTINGS, None),
        before_exit_check=look,
    )
    drain(RUN_SETTINGS, budget, registry, db_url, queues=["emails"], hooks=control)
    assert seen == [[("run-b", ["emails"])]]
    assert conn.execute("SELECT count(*) FROM pgdrain.runs").fetchone() == (0,)


def test_an_exit_forgets_the_rows_of_runs_long_dead(db_url: str, conn: Conn) -> None:
    from pgdrain import store

    store.run_register(conn, "died-long-ago", ["emails"], 0, 10)
    store.run_register(conn, "died-just-now", ["emails"], 0, 10)
    conn.execute(
        "UPDATE pgdrain.runs SET deadline = now() - interval '2 hours'"
        " WHERE run_id = 'died-long-ago'"
    )
    store.run_exit(conn, "another-run", ["emails"])
    rows = conn.execute("SELECT run_id FROM pgdrain.runs").fetchall()
    assert rows == [("died-just-now",)]
