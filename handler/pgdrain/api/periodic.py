"""Periodic jobs declared in code: a 5-field cron expression or a fixed rate, in UTC.

No scheduler process and no extra AWS resource: every drain run calls `enqueue_due` as it
starts, which enqueues the latest due slot of each periodic kind of the queues it drains once
(pgdrain.periodic_slots keeps the latest slot enqueued per kind, so a second run's insert is a
no-op, whatever became of the first slot's job), and `next_periodic_slot` gives the control
plane the next moment a slot of those kinds falls due, to set the wake-at time so the database
sleeps until then. A kind whose queue the function does not drain is warned of at its start
(`warn_of_undrained`): no run of that function enqueues it or wakes up for it.

Missed slots are not back-filled: after a quiet spell, only the latest slot that fell due is
enqueued (a periodic job is "the latest state", not a ledger of every tick).

The cron parser is ours (about 80 lines, tested): croniter, the usual package, was announced
unmaintained by its author in late 2024 (it lives on under pallets-eco), and five fields need
no dependency."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pgdrain.api.enqueue import build_job
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.settings import describe_queues, serves

log = logging.getLogger(__name__)

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
# Far enough to find the next slot of any valid expression (Feb 29 on a given weekday recurs
# within 28 years); an expression with no slot in that span (Feb 30) is refused at parse time.
_SEARCH_YEARS = 29

_MONTHS = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_DAYS = "sun mon tue wed thu fri sat".split()


@dataclass(frozen=True)
class Cron:
    """A 5-field cron expression: minute hour day-of-month month day-of-week, in UTC.
    Fields take `*`, numbers, `a-b`, `*/n`, `a-b/n` and lists (`1,15,30`); months and days also
    take names (`jan`, `mon`); day-of-week 0 and 7 are Sunday. As in cron, when both
    day-of-month and day-of-week are restricted, a day matching either is a slot."""

    expression: str
    minutes: frozenset[int] = field(init=False, repr=False)
    hours: frozenset[int] = field(init=False, repr=False)
    days: frozenset[int] = field(init=False, repr=False)
    months: frozenset[int] = field(init=False, repr=False)
    weekdays: frozenset[int] = field(init=False, repr=False)  # 0 = Sunday
    any_day: bool = field(init=False, repr=False)
    any_weekday: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) != 5:
            raise ValueError(
                f"cron {self.expression!r}: needs 5 fields (minute hour day month weekday)"
            )
        minute, hour, day, month, weekday = fields
        set_ = object.__setattr__  # frozen: the parsed fields are set once, here
        set_(self, "minutes", _field(minute, 0, 59, "minute"))
        set_(self, "hours", _field(hour, 0, 23, "hour"))
        set_(self, "days", _field(day, 1, 31, "day of month"))
        set_(self, "months", _field(month, 1, 12, "month", _MONTHS, 1))
        weekdays = _field(weekday, 0, 7, "day of week", _DAYS, 0)
        set_(self, "weekdays", frozenset(d % 7 for d in weekdays))
        # As cron does: a field that starts with `*` does not restrict the day.
        set_(self, "any_day", day.startswith("*"))
        set_(self, "any_weekday", weekday.startswith("*"))
        try:
            self.next_after(EPOCH)
        except LookupError:
            raise ValueError(f"cron {self.expression!r}: never matches a date") from None

    def _day_matches(self, day: dt.date) -> bool:
        in_month = day.day in self.days
        in_week = day.isoweekday() % 7 in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return in_week
        if self.any_weekday:
            return in_month
        return in_month or in_week

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """The first slot strictly after `moment` (aware; UTC is used)."""
        start = _utc(moment).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        day = start.date()
        last = day.replace(year=day.year + _SEARCH_YEARS)
        while day <= last:
            if day.month in self.months and self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        slot = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
                        if slot >= start:
                            return slot
            day += dt.timedelta(days=1)
        raise LookupError(f"cron {self.expression!r}: no slot in {_SEARCH_YEARS} years")

    def latest_at_or_before(self, moment: dt.datetime) -> dt.datetime | None:
        """The last slot at or before `moment` within the previous 366 days (or None)."""
        end = _utc(moment).replace(second=0, microsecond=0)
        day = end.date()
        first = day - dt.timedelta(days=366)
        while day >= first:
            if day.month in self.months and self._day_matches(day):
                for hour in sorted(self.hours, reverse=True):
                    for minute in sorted(self.minutes, reverse=True):
                        slot = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
                        if slot <= end:
                            return slot
            day -= dt.timedelta(days=1)
        return None


@dataclass(frozen=True)
class Every:
    """A fixed rate: slots at EPOCH + k * interval (UTC), so every run agrees on them."""

    interval: dt.timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.interval, dt.timedelta):  # every=3600: seconds, or minutes?
            raise ValueError(
                f"every= takes a datetime.timedelta (timedelta(hours=1)), not "
                f"{type(self.interval).__name__}"
            )
        if self.interval < dt.timedelta(minutes=1):
            raise ValueError("every= must be at least one minute")

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        passed = (_utc(moment) - EPOCH) // self.interval
        return EPOCH + (passed + 1) * self.interval

    def latest_at_or_before(self, moment: dt.datetime) -> dt.datetime | None:
        return EPOCH + ((_utc(moment) - EPOCH) // self.interval) * self.interval


Schedule = Cron | Every


class Periodic(NamedTuple):
    """One periodic kind: when, and the job each slot enqueues."""

    kind: str
    schedule: Schedule
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    recovery_policy: str = "auto"

    def job_for(self) -> store.NewJob:
        """The job each slot enqueues (validated as enqueue validates)."""
        return build_job(
            self.kind,
            self.payload,
            queue_name=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
            recovery_policy=self.recovery_policy,
        )


def of_queues(periodics: Iterable[Periodic], queues: Sequence[str] | None) -> tuple[Periodic, ...]:
    """The periodic kinds whose jobs go to one of `queues`: those a run draining them enqueues
    and wakes up for."""
    return tuple(p for p in periodics if serves(queues, p.queue))


def warn_of_undrained(
    periodics: Iterable[Periodic], queues: Sequence[str] | None, variable: str = "PGDRAIN_QUEUES"
) -> list[str]:
    """Log, once per kind, each periodic kind whose queue is not among `queues` (what a
    function drains): its runs neither enqueue its slots nor wake up for them. A deployment
    that drains that queue does both; when none does, the kind never runs. A warning, not a
    refusal: pgdrain cannot see whether another deployment drains the queue. Returns the
    kinds."""
    kinds = []
    for p in periodics:
        if not serves(queues, p.queue):
            kinds.append(p.kind)
            log.warning(
                "periodic kind %r goes to queue %r, which is not drained here (%s=%s): its "
                "slots are not enqueued and wake nothing; add the queue to %s, or drain it "
                "elsewhere",
                p.kind,
                p.queue,
                variable,
                describe_queues(None if queues is None else tuple(queues)),
                variable,
            )
    return kinds


def due_slots(
    periodics: Iterable[Periodic], now: dt.datetime
) -> list[tuple[dt.datetime, store.NewJob]]:
    """The latest due slot of each periodic kind, with the job to insert for it (pure: `now`
    is given)."""
    due = []
    for periodic in periodics:
        slot = periodic.schedule.latest_at_or_before(now)
        if slot is not None:
            due.append((slot, periodic.job_for()))
    return due


@store.one_statement
def enqueue_due(
    conn: store.Connection, periodics: Sequence[Periodic], now: dt.datetime | None = None
) -> int:
    """Enqueue each periodic kind's latest due slot; returns how many were new. One statement
    (store.periodic_enqueue, autocommit on a run's connection); a slot no later than the last
    one enqueued for its kind is skipped, so running this twice (a retry after a reconnect,
    two runs at once) enqueues nothing more."""
    if not periodics:
        return 0  # no statement at all for a registry without periodic kinds
    due = due_slots(periodics, now or dt.datetime.now(UTC))
    created = len(store.periodic_enqueue(conn, due))
    if created:
        log.info("periodic slots enqueued", extra={"enqueued": created})
    return created


def next_periodic_slot(
    periodics: Iterable[Periodic], now: dt.datetime | None = None
) -> dt.datetime | None:
    """The earliest slot after `now` (default: the current time) of any periodic kind, in UTC,
    or None when there is none. For the control plane: a run that ends should make sure a
    wake-up is scheduled no later than this, so the slot's job is enqueued (by that run's
    enqueue_due) and run on time while the database sleeps in between."""
    moment = now or dt.datetime.now(UTC)
    return min((p.schedule.next_after(moment) for p in periodics), default=None)


class EnqueuedSince:
    """When a run last enqueued its periodic kinds' due slots (at its start). The slots it
    wakes up for are counted from then, not from its end: a slot that fell due while it
    drained is enqueued before it exits (its exit check then sees the job), not skipped.
    `catch_up` False (a test's control): counted from the end, and none enqueued at the exit."""

    def __init__(
        self,
        periodics: Sequence[Periodic],
        *,
        catch_up: bool = True,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(UTC),
    ) -> None:
        self.periodics = tuple(periodics)
        self._catch_up = catch_up
        self._clock = clock
        self.at = clock()

    def enqueued(self) -> None:
        """The run enqueues its due slots now (or is about to: runner/drain.py)."""
        self.at = self._clock()

    def enqueue_fallen_due(self, session: Session) -> None:
        """Before the run's exit check: the slots that fell due while it drained, enqueued in
        a statement of their own (none when no slot did), so the check sees their jobs and the
        run drains them. Safe to repeat: enqueue_due enqueues a slot once."""
        now = self._clock()
        due = self.next_slot()
        if self._catch_up and due is not None and due <= now:
            session.run(enqueue_due, self.periodics, now)
            self.at = now

    def next_slot(self) -> dt.datetime | None:
        """The first slot not yet enqueued: possibly past, when it fell due meanwhile."""
        return next_periodic_slot(self.periodics, self.at if self._catch_up else self._clock())


def _utc(moment: dt.datetime) -> dt.datetime:
    if moment.tzinfo is None:
        raise ValueError("a periodic schedule needs a timezone-aware time")
    return moment.astimezone(UTC)


def _field(
    text: str,
    low: int,
    high: int,
    what: str,
    names: Sequence[str] = (),
    first_name: int = 0,
) -> frozenset[int]:
    values: set[int] = set()
    for part in text.lower().split(","):
        values |= _part(part, low, high, what, names, first_name)
    return frozenset(values)


def _part(
    part: str, low: int, high: int, what: str, names: Sequence[str], first_name: int
) -> set[int]:
    def number(token: str) -> int:
        if token in names:
            return names.index(token) + first_name
        if not token.isdigit():
            raise ValueError(f"cron {what}: {token!r} is not a number")
        value = int(token)
        if not low <= value <= high:
            raise ValueError(f"cron {what}: {value} is outside {low}-{high}")
        return value

    span, _, step_text = part.partition("/")
    step = 1
    if step_text:
        if not step_text.isdigit() or int(step_text) == 0:
            raise ValueError(f"cron {what}: step {step_text!r} must be a positive number")
        step = int(step_text)
    if span == "*":
        start, end = low, high
    elif "-" in span:
        first, _, last = span.partition("-")
        start, end = number(first), number(last)
        if start > end:
            raise ValueError(f"cron {what}: range {span!r} runs backwards")
    else:
        start = number(span)
        end = high if step_text else start  # "5/15" = from 5, every 15
    return set(range(start, end + 1, step))
