"""A periodic kind's next slot feeds the run's wake-up: an empty queue with a periodic kind
still ends with a wake-up at that slot (rounded up to the schedule's precision), so periodic
work needs no schedule of its own. The control: the same run without the slot wakes for
nothing, and the slot would wait for the hourly safety net."""

from __future__ import annotations

import datetime as dt

import pytest

from pgdrain import Budget, Registry, Settings, drain
from pgdrain.api.periodic import next_periodic_slot
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.wake import Waker, wake_time

jobs = Registry()


@jobs.periodic(every=dt.timedelta(minutes=15), kind="report")
def report(job: object) -> None:
    pass


@pytest.mark.parametrize("with_slot", [True, False], ids=["slot-fed", "control-no-slot"])
def test_an_empty_run_wakes_for_the_next_periodic_slot(db_url: str, with_slot: bool) -> None:
    settings = Settings()
    budget = Budget.seconds(30)

    def slot() -> dt.datetime | None:
        return next_periodic_slot(jobs.periodics) if with_slot else None

    control = RunControl(
        events.Trigger("schedule", ("default",)),
        "periodic-run",
        budget,
        waker=Waker(settings, None),  # no schedule here: the wake time is reported
        next_periodic_slot=slot,
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
