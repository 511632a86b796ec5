"""Periodic schedules: the 5-field cron parser and fixed rates, pure functions of a given time."""

from __future__ import annotations

import datetime as dt

import pytest

from pgdrain import Job, Registry
from pgdrain.api.periodic import Cron, Every, Periodic, due_slots, next_periodic_slot


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("* * * * *", "2026-12-01 04:12:30", "2026-12-01 04:13"),
        ("*/15 * * * *", "2026-12-01 04:12", "2026-12-01 04:15"),
        ("*/15 * * * *", "2026-12-01 04:15", "2026-12-01 04:30"),  # strictly after
        ("0 * * * *", "2026-12-01 23:30", "2026-12-02 00:00"),
        ("30 2 * * *", "2026-12-01 02:30", "2026-12-02 02:30"),
        ("0 9 * * mon-fri", "2026-12-04 10:00", "2026-12-07 09:00"),  # Fri -> Mon
        ("0 0 1 * *", "2026-12-15 00:00", "2027-01-01 00:00"),
        ("0 0 29 feb *", "2026-03-01 00:00", "2028-02-29 00:00"),  # the next leap year
        ("0 0 * * 7", "2026-12-01 00:00", "2026-12-06 00:00"),  # 7 is Sunday, as 0
        ("5/20 * * * *", "2026-12-01 04:06", "2026-12-01 04:25"),
        ("0,30 8-10/2 * * *", "2026-12-01 08:45", "2026-12-01 10:00"),
        # Day of month and day of week both restricted: either matches (cron's rule).
        ("0 0 13 * fri", "2026-12-01 00:00", "2026-12-04 00:00"),
        ("0 0 13 * fri", "2026-12-11 00:00", "2026-12-13 00:00"),
        ("0 0 */2 * mon", "2026-12-01 00:00", "2026-12-07 00:00"),  # a `*` day: weekday only
    ],
)
def test_cron_next_slot(expression: str, after: str, expected: str) -> None:
    assert Cron(expression).next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    ("expression", "moment", "expected"),
    [
        ("*/15 * * * *", "2026-12-01 04:12:59", "2026-12-01 04:00"),
        ("*/15 * * * *", "2026-12-01 04:15", "2026-12-01 04:15"),  # at the slot: due
        ("0 9 * * mon", "2026-12-03 08:00", "2026-11-30 09:00"),
    ],
)
def test_cron_latest_due_slot(expression: str, moment: str, expected: str) -> None:
    assert Cron(expression).latest_at_or_before(at(moment)) == at(expected)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("* * * *", "5 fields"),
        ("60 * * * *", "outside 0-59"),
        ("* 24 * * *", "outside 0-23"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "backwards"),
        ("x * * * *", "not a number"),
        ("1,,2 * * * *", "not a number"),
        ("0 0 30 feb *", "never matches"),
        ("0 0 * 13 *", "outside 1-12"),
    ],
)
def test_bad_cron_expressions_are_refused(expression: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Cron(expression)


def test_a_rate_has_slots_every_interval_since_the_epoch() -> None:
    every = Every(dt.timedelta(minutes=10))
    assert every.next_after(at("2026-12-01 04:12")) == at("2026-12-01 04:20")
    assert every.latest_at_or_before(at("2026-12-01 04:12")) == at("2026-12-01 04:10")
    with pytest.raises(ValueError, match="one minute"):
        Every(dt.timedelta(seconds=30))
    # A red team's report: every=3600 raised a TypeError comparing an int with a timedelta.
    with pytest.raises(ValueError, match=r"takes a datetime\.timedelta"):
        Every(3600)  # type: ignore[arg-type]


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        Cron("* * * * *").next_after(dt.datetime(2026, 12, 1))


def test_only_the_latest_due_slot_is_enqueued() -> None:
    cleanup = Periodic("cleanup", Cron("*/15 * * * *"), {"days": 7}, queue="maintenance")
    [(slot, job)] = due_slots([cleanup], at("2026-12-01 04:44"))
    assert slot == at("2026-12-01 04:30")  # not 04:00 or 04:15 as well
    assert (job.kind, job.payload, job.queue) == ("cleanup", {"days": 7}, "maintenance")
    [(same, _)] = due_slots([cleanup], at("2026-12-01 04:40"))
    assert same == slot  # a second run: the same slot


def test_next_periodic_slot_is_the_earliest_of_all_kinds() -> None:
    kinds = [
        Periodic("hourly", Cron("0 * * * *")),
        Periodic("rate", Every(dt.timedelta(minutes=30))),
    ]
    # 04:12 -> hourly 05:00; every 30 min since the epoch -> 04:30
    assert next_periodic_slot(kinds, at("2026-12-01 04:12")) == at("2026-12-01 04:30")
    assert next_periodic_slot([], at("2026-12-01 04:12")) is None


def test_the_decorator_registers_the_kind_and_its_schedule() -> None:
    jobs = Registry()

    @jobs.periodic("*/15 * * * *", queue="maintenance", priority=5)
    def cleanup(job: Job) -> None:
        pass

    @jobs.periodic(every=dt.timedelta(hours=1), kind="report", payload={"format": "csv"})
    def hourly(job: Job) -> None:
        pass

    assert jobs.kinds() == ["cleanup", "report"]
    [first, second] = jobs.periodics
    assert (first.kind, first.queue, first.priority) == ("cleanup", "maintenance", 5)
    assert (second.kind, second.payload) == ("report", {"format": "csv"})


@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [
        ((), {}, "one of the two"),
        (("* * * * *",), {"every": dt.timedelta(hours=1)}, "one of the two"),
        (("bad",), {}, "5 fields"),
        (("* * * * *",), {"payload": {"x": float("nan")}}, "JSON"),
        # Every slot's enqueue would be refused: printable, as enqueue takes kinds.
        (("* * * * *",), {"kind": "nightly\treport"}, "printable"),
        (("* * * * *",), {"queue": ""}, "queue"),
        (("* * * * *",), {"recovery_policy": ""}, "recovery_policy"),
    ],
)
def test_bad_periodic_declarations_fail_at_import(
    args: tuple[str, ...], kwargs: dict[str, object], reason: str
) -> None:
    jobs = Registry()
    with pytest.raises(ValueError, match=reason):

        @jobs.periodic(*args, **kwargs)  # type: ignore[arg-type]
        def kind(job: Job) -> None:
            pass
