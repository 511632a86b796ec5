"""The safety net slides: a run that ends having found every queue of the function empty has
done what a safety-net run does, so it moves the next one to ScheduleRate after itself,
instead of leaving the database to be woken on the rate schedule's fixed grid.

The next safety-net run is one one-shot schedule with a fixed name (SAFETY_SCHEDULE, in the
wake-up group, through the wake-up role) that sends {"pgdrain": {"reason": "safety"}}: a
scheduled run, housekeeping included. Each sliding run updates it to `at(end + ScheduleRate)`
(rounded up to the minute) or creates it. The rate schedule stays, at ScheduleRate, as the net
under the net: each of its ticks first reads that one schedule (one GetSchedule, no database)
and, while it is pending, returns without connecting. When it is missing (never made, deleted
after it fired and its run died, a failed update), the tick runs as it always did.

So a database with work arriving at least once per ScheduleRate is never woken by the safety
net, and an idle one is woken once per ScheduleRate, as before. Every step is safe to repeat:
an update writes the same definition again (the latest writer wins, and every writer asks for
about ScheduleRate from now); a creation racing another is a ConflictException, and the update
after it wins. A failure is logged and counted (WakeFailed, as the wake-ups' are), never
raised: the rate schedule's next tick then runs. Not tracked in the database: the tick that
reads it must not connect."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pgdrain.aws.events import safety_event
from pgdrain.aws.wake import (
    TARGET_MAX_EVENT_AGE_SECONDS,
    TARGET_RETRY_ATTEMPTS,
    WAKE_FAILED_METRIC,
    Scheduling,
    at_expression,
    wake_time,
)
from pgdrain.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_scheduler import EventBridgeSchedulerClient

log = logging.getLogger(__name__)

SAFETY_SCHEDULE = "pgdrain-safety-net"
AT = re.compile(r"^at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)\Z")

SlideAction = Literal["moved", "created", "unchanged", "failed"]

# What this execution environment last set the schedule to: a run ending within one precision
# of the last one here asks for the same minute, so it makes no call.
_last_set: dict[str, dt.datetime] = {}
_last_set_lock = threading.Lock()


class SlideOutcome(NamedTuple):
    at: dt.datetime
    action: SlideAction

    def as_dict(self) -> dict[str, Any]:
        return {"safety_net_at": self.at.isoformat(), "safety_net": self.action}


class SafetyNet(Scheduling):
    def __init__(
        self,
        settings: Settings,
        target_arn: str | None,
        *,
        client: EventBridgeSchedulerClient | None = None,
        count: Callable[[str, int], None] | None = None,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        super().__init__(settings, target_arn, client=client, count=count)
        self._now = now

    @property
    def slides(self) -> bool:
        return self.can_schedule and self._settings.schedule_rate_seconds is not None

    def slide(self) -> SlideOutcome | None:
        """Move the next safety-net run to ScheduleRate from now (None: no sliding here)."""
        if not self.slides:
            return None
        settings = self._settings
        assert settings.schedule_group and settings.schedule_rate_seconds is not None
        rate = dt.timedelta(seconds=settings.schedule_rate_seconds)
        at = wake_time(self._now() + rate, settings.wake_precision_seconds)
        with _last_set_lock:
            if _last_set.get(settings.schedule_group) == at:
                return SlideOutcome(at, "unchanged")
        try:
            action = self._put(at)
        except Exception as exc:  # any AWS failure: logged and counted, never fails the run
            log.error(
                "could not move the safety-net schedule; the rate schedule's next tick runs",
                extra={"schedule": SAFETY_SCHEDULE, "at": at.isoformat(), "error": str(exc)},
            )
            self._count(WAKE_FAILED_METRIC, 1)
            return SlideOutcome(at, "failed")
        with _last_set_lock:
            _last_set[settings.schedule_group] = at
        log.info("safety net moved", extra={"schedule": SAFETY_SCHEDULE, "at": at.isoformat()})
        return SlideOutcome(at, action)

    def pending(self) -> dt.datetime | None:
        """When the next safety-net run is due, if one is (its schedule exists and its moment
        has not come); None when it is not, or cannot be read (the tick then runs)."""
        if not self.slides:
            return None
        assert self._settings.schedule_group
        try:
            schedule = self._scheduler().get_schedule(
                Name=SAFETY_SCHEDULE, GroupName=self._settings.schedule_group
            )
        except Exception as exc:  # a missing schedule (or any failure): the tick runs
            if _error_code(exc) != "ResourceNotFoundException":
                log.warning("could not read the safety-net schedule: %s", exc)
            return None
        match = AT.match(str(schedule.get("ScheduleExpression", "")))
        if match is None:
            return None
        at = dt.datetime.fromisoformat(match.group(1)).replace(tzinfo=dt.UTC)
        return at if at > self._now() else None

    def _put(self, at: dt.datetime) -> SlideAction:
        try:
            self._update(at)
            return "moved"
        except Exception as exc:
            if _error_code(exc) != "ResourceNotFoundException":
                raise
        try:
            self._create(at)
            return "created"
        except Exception as exc:
            if _error_code(exc) != "ConflictException":
                raise
        self._update(at)  # another run created it meanwhile: this run's moment, the later one
        return "moved"

    def _definition(self, at: dt.datetime) -> dict[str, Any]:
        settings = self._settings
        assert self._target and settings.schedule_group and settings.scheduler_role_arn
        return {
            "Name": SAFETY_SCHEDULE,
            "GroupName": settings.schedule_group,
            "ScheduleExpression": at_expression(at),
            "ScheduleExpressionTimezone": "UTC",
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "ActionAfterCompletion": "DELETE",
            "Description": "pgdrain safety net: ScheduleRate after the last run that found "
            "every queue empty",
            "Target": {
                "Arn": self._target,
                "RoleArn": settings.scheduler_role_arn,
                "Input": json.dumps(safety_event()),
                "RetryPolicy": {
                    "MaximumRetryAttempts": TARGET_RETRY_ATTEMPTS,
                    "MaximumEventAgeInSeconds": TARGET_MAX_EVENT_AGE_SECONDS,
                },
            },
        }

    def _update(self, at: dt.datetime) -> None:
        self._scheduler().update_schedule(**self._definition(at))

    def _create(self, at: dt.datetime) -> None:
        self._scheduler().create_schedule(**self._definition(at))


def forget_last_set() -> None:
    """Tests: start as a new execution environment would."""
    with _last_set_lock:
        _last_set.clear()


def _error_code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return None if code is None else str(code)
