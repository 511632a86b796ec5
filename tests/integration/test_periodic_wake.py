"""A periodic kind's next slot feeds the run's wake-up: an empty queue with a periodic kind
still ends with a wake-up at that slot (rounded up to the schedule's precision), so periodic
work needs no schedule of its own. The control: the same run without the slot wakes for
nothing, and the slot would wait for the hourly safety net. Only the kinds of the queues a run
drains: a kind on another queue is neither enqueued nor woken for (its control: every kind)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import psycopg
import pytest

from helpers import periodic_jobs
from pgdrain import Budget, Registry, Settings, drain, enqueue
from pgdrain.api.periodic import Periodic, next_periodic_slot
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.wake import Waker, wake_time
from pgdrain.controls import Controls
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]

jobs = Registry()


@jobs.periodic(every=dt.timedelta(minutes=15), kind="report")
def report(job: object) -> None:
    pass


@pytest.mark.parametrize("with_slot", [True, False], ids=["slot-fed", "control-no-slot"])
def test_an_empty_run_wakes_for_the_next_periodic_slot(db_url: str, with_slot: bool) -> None:
    settings = Settings()
    budget = Budget.seconds(30)

    control = RunControl(
        events.Trigger("schedule", ("default",)),
        "periodic-run",
        budget,
        waker=Waker(settings, None),  # no schedule here: the wake time is reported
        periodics=jobs.periodics if with_slot else (),
    )
    before = dt.datetime.now(dt.UTC)
    result = drain(settings, budget, jobs, db_url, hooks=control)
    after = dt.datetime.now(dt.UTC)
    assert result.stop_reason == "empty", result.error
    if with_slot:
        # The slot after the run (the same as before it, unless a boundary fell in between).
        slots = {next_periodic_slot(jobs.periodics, moment) for moment in (before, after)}
        expected = {wake_time(s, settings.wake_precision_seconds) for s in slots if s}
        assert control.wake.action == "reported"
        assert control.wake.wake_at in expected
    else:
        assert (control.wake.wake_at, control.wake.action) == (None, "none")


# -- a periodic kind on a queue the run does not drain --------------------------------------------


def _next_wakes(kinds: tuple[Periodic, ...], before: dt.datetime, after: dt.datetime) -> set[Any]:
    """The wake-up for the next slot of these kinds, seen from either side of the run."""
    slots = {next_periodic_slot(kinds, moment) for moment in (before, after)}
    return {wake_time(s, Settings().wake_precision_seconds) for s in slots if s}


@pytest.mark.parametrize("only_drained", [True, False], ids=["drained-kinds", "control-every-kind"])
def test_a_kind_on_a_queue_the_run_does_not_drain_is_not_enqueued_nor_woken_for(
    db_url: str, conn: Conn, only_drained: bool
) -> None:
    """docs/jobs.md's example: `cleanup` every 15 minutes on the maintenance queue, which this
    function does not drain (PGDRAIN_QUEUES=default). The run enqueues and wakes up only for
    `report`, the kind of its own queue. The control (every kind, as before): cleanup's slot is
    enqueued where no run takes it, and the wake-up comes at its next slot, for nothing."""
    settings = Settings(queues=("default",))
    controls = Controls(periodics_of_drained_queues=only_drained)
    budget = Budget.seconds(30)
    control = RunControl(
        events.Trigger("schedule", settings.queues),
        "periodic-run",
        budget,
        waker=Waker(settings, None),
        periodics=periodic_jobs.jobs.periodics,
        controls=controls,
    )
    before = dt.datetime.now(dt.UTC)
    result = drain_with(controls, settings, budget, periodic_jobs.jobs, db_url, hooks=control)
    after = dt.datetime.now(dt.UTC)

    assert result.stop_reason == "empty", result.error
    rows = conn.execute("SELECT queue, kind, status FROM pgdrain.jobs ORDER BY queue").fetchall()
    report, cleanup = (
        tuple(p for p in periodic_jobs.jobs.periodics if p.kind == k) for k in ("report", "cleanup")
    )
    assert control.wake.action == "reported"
    if only_drained:
        assert rows == [("default", "report", "done")]
        assert control.wake.wake_at in _next_wakes(report, before, after)
    else:
        assert rows == [("default", "report", "done"), ("maintenance", "cleanup", "queued")]
        assert control.wake.wake_at in _next_wakes(cleanup, before, after)


def test_a_run_that_drains_the_kinds_queue_enqueues_it_and_wakes_for_it(
    db_url: str, conn: Conn
) -> None:
    settings = Settings(queues=("default", "maintenance"))
    budget = Budget.seconds(30)
    control = RunControl(
        events.Trigger("schedule", settings.queues),
        "periodic-run",
        budget,
        waker=Waker(settings, None),
        periodics=periodic_jobs.jobs.periodics,
    )
    before = dt.datetime.now(dt.UTC)
    result = drain(settings, budget, periodic_jobs.jobs, db_url, hooks=control)
    after = dt.datetime.now(dt.UTC)

    assert result.stop_reason == "empty", result.error
    rows = conn.execute("SELECT queue, kind, status FROM pgdrain.jobs ORDER BY queue").fetchall()
    assert rows == [("default", "report", "done"), ("maintenance", "cleanup", "done")]
    assert control.wake.wake_at in _next_wakes(periodic_jobs.jobs.periodics, before, after)


class _Kept(logging.Handler):
    """The records of one logger, whatever the handlers and propagation above it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_function_warns_at_its_start_of_a_kind_no_run_of_it_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refusing would stop a function whose kind's queue another deployment drains (two stacks
    sharing one jobs module): a warning, once per execution environment, and its runs leave
    that kind alone."""
    from pgdrain.aws import run as lambda_run

    kept = _Kept()
    logger = logging.getLogger("pgdrain.api.periodic")
    monkeypatch.setattr(logger, "handlers", [kept])
    env = {"PGDRAIN_JOBS": "helpers.periodic_jobs", "PGDRAIN_QUEUES": "default"}
    runtime = lambda_run.cold_start(env)
    assert runtime.error is None and runtime.registry is periodic_jobs.jobs
    assert kept.lines == [
        "periodic kind 'cleanup' goes to queue 'maintenance', which is not drained here "
        "(PGDRAIN_QUEUES=default): its slots are not enqueued and wake nothing; add the queue "
        "to PGDRAIN_QUEUES, or drain it elsewhere"
    ]

    kept.lines.clear()
    lambda_run.cold_start({**env, "PGDRAIN_QUEUES": "default,maintenance"})
    assert kept.lines == []


# -- a slot that falls due while the run drains -------------------------------------------------

minutely = Registry()


class _LaterClock:
    """The run's UTC clock, which a job moves a minute ahead: the drain then straddles a slot
    boundary, deterministically."""

    def __init__(self) -> None:
        self.ahead = dt.timedelta(0)

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.ahead


clock = _LaterClock()


@minutely.periodic(every=dt.timedelta(minutes=1), kind="tick")
def tick(job: object) -> None:
    pass


@minutely.job("straddle")
def straddle(job: object) -> None:
    clock.ahead += dt.timedelta(minutes=1)


@pytest.mark.parametrize("catch_up", [True, False], ids=["enqueued-at-exit", "control-skipped"])
def test_a_slot_that_falls_due_while_the_run_drains_is_enqueued_not_skipped(
    db_url: str, conn: Conn, catch_up: bool
) -> None:
    """A red team's finding: the run enqueued its due slots at its start and, at its end, woke
    up for the first slot after its end, so a slot that fell due while it drained was enqueued
    by no run (the control). Now the run enqueues that slot before its exit check, which sees
    its job: the run drains it too."""
    clock.ahead = dt.timedelta(0)
    settings = Settings()
    controls = Controls(enqueue_slots_fallen_due=catch_up)
    budget = Budget.seconds(30)
    control = RunControl(
        events.Trigger("schedule", ("default",)),
        "periodic-run",
        budget,
        waker=Waker(settings, None),
        periodics=minutely.periodics,
        utc_clock=clock,
        controls=controls,
    )
    with conn.transaction():
        enqueue(conn, "straddle", {})
    started = dt.datetime.now(dt.UTC)
    result = drain_with(controls, settings, budget, minutely, db_url, hooks=control)
    assert result.stop_reason == "empty", result.error
    ticks = conn.execute("SELECT status FROM pgdrain.jobs WHERE kind = 'tick'").fetchall()
    slot_during_the_drain = next_periodic_slot(minutely.periodics, started)
    assert slot_during_the_drain is not None and control.wake.wake_at is not None
    assert control.wake.wake_at > slot_during_the_drain
    if catch_up:
        assert ticks == [("done",), ("done",)]
    else:
        assert ticks == [("done",)]  # the slot that fell due while it drained: no job
