"""Wake-ups: a run that ends with work due later in its queues (a delayed job, a retry backoff,
a lease that a dead run holds) makes sure a one-shot EventBridge Scheduler schedule invokes the
function when that work is due, so nothing waits for the hourly safety net and nothing polls.

The schedule: `at(...)` in UTC rounded up to the precision (a minute;
PGDRAIN_WAKE_PRECISION_SECONDS), FlexibleTimeWindow OFF, ActionAfterCompletion DELETE, in the
stack's group (PGDRAIN_SCHEDULE_GROUP) through its role (PGDRAIN_SCHEDULER_ROLE_ARN), with
the wake event {"pgdrain": {"reason": "wake", "queues": [...]}}. Its name is deterministic (the
minute and the queues), so runs ending together make one schedule, and ConflictException (it
exists) is success.

Pending wake-ups are tracked in pgdrain.wakes, not by listing schedules: a run first reserves
the wake-up (none is made when an earlier or equal one is pending), then creates the schedule,
then marks it created. Every step is safe to repeat: the reservation admits its own run again,
a second CreateSchedule of the same name is a ConflictException, and marking is an UPDATE to
the same values. A creation that fails releases the reservation, and one whose run died before
it could (a timeout) holds only WAKE_HOLD_SECONDS, so no row outlives a failure to suppress the
next run's attempt. A failure is logged and counted (WakeFailed), never raised: the hourly
schedule is the safety net."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pgdrain.aws.events import wake_event
from pgdrain.aws.lambda_api import region_from_arn
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_scheduler import EventBridgeSchedulerClient

log = logging.getLogger(__name__)

# A reservation not marked created within this long stops suppressing other runs' wake-ups.
WAKE_HOLD_SECONDS = 30.0
# No wake-up is made further ahead than this: work due later is woken for at the horizon, and
# the run then finds it still due and wakes for it again. A schedule outlives the run (and
# whoever sent the event) that made it; this bounds for how long.
WAKE_HORIZON_SECONDS = 86400.0
# What one Waker (one per invocation) may create: a run ends once, with one wake-up.
MAX_SCHEDULES_PER_WAKER = 1
SCHEDULE_PREFIX = "pgdrain-wake-"
WAKE_FAILED_METRIC = "WakeFailed"
WAKE_CREATED_METRIC = "WakeCreated"
# If the invoke fails (throttling), EventBridge Scheduler tries again for this long.
TARGET_RETRY_ATTEMPTS = 10
TARGET_MAX_EVENT_AGE_SECONDS = 600
CONNECT_TIMEOUT_SECONDS = 2
READ_TIMEOUT_SECONDS = 5

WakeAction = Literal["none", "reported", "pending", "created", "exists", "failed", "refused"]


class WakeOutcome(NamedTuple):
    """What a run did about its next due moment: `none` (nothing due), `reported` (no
    schedule can be made here: local runs; the time is in the summary and the log), `pending`
    (an earlier or equal wake-up exists), `created`, `exists` (another run made the same
    schedule), `failed` (logged and counted; the safety net covers it), `refused` (a wake-up
    request the database does not hold: pgdrain.aws.wake_request)."""

    wake_at: dt.datetime | None
    action: WakeAction
    schedule: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "wake_at": None if self.wake_at is None else self.wake_at.isoformat(),
            "wake": self.action,
            "wake_schedule": self.schedule,
        }


def wake_time(due: dt.datetime, precision_seconds: float) -> dt.datetime:
    """`due` in UTC, rounded up to a whole multiple of the precision: a one-shot schedule fires
    at its minute, never before the work is due."""
    stamp = due.timestamp()
    rounded = math.ceil(round(stamp, 6) / precision_seconds) * precision_seconds
    return dt.datetime.fromtimestamp(rounded, tz=dt.UTC)


# The queue set of a run of every queue: no queue name holds a '*' (settings.QUEUE_NAME).
EVERY_QUEUE_SET = "*"


def wake_moment(
    due: dt.datetime, precision_seconds: float, now: dt.datetime | None = None
) -> dt.datetime:
    """When to wake for work `due`: at most WAKE_HORIZON_SECONDS ahead of `now`, rounded up
    to the precision (wake_time)."""
    now = now or dt.datetime.now(dt.UTC)
    return wake_time(min(due, now + dt.timedelta(seconds=WAKE_HORIZON_SECONDS)), precision_seconds)


def queue_set(queues: Sequence[str] | None) -> str:
    """The key of a set of queues in pgdrain.wakes (None: every queue)."""
    return EVERY_QUEUE_SET if queues is None else ",".join(sorted(set(queues)))


def schedule_name(queues: Sequence[str] | None, wake_at: dt.datetime) -> str:
    """The same for every run that wants these queues woken at this moment (at most 64
    characters, as Scheduler allows)."""
    digest = hashlib.sha256(queue_set(queues).encode("utf-8")).hexdigest()[:12]
    return f"{SCHEDULE_PREFIX}{wake_at.astimezone(dt.UTC):%Y%m%dT%H%M%S}-{digest}"


def at_expression(wake_at: dt.datetime) -> str:
    return f"at({wake_at.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S})"


_clients: dict[str | None, EventBridgeSchedulerClient] = {}
_clients_lock = threading.Lock()


def scheduler_client(region: str | None = None) -> EventBridgeSchedulerClient:
    """A Scheduler client with short timeouts, made once per region; created the usual way, so
    AWS_ENDPOINT_URL_SCHEDULER points it elsewhere (a simulator)."""
    with _clients_lock:
        client = _clients.get(region)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                read_timeout=READ_TIMEOUT_SECONDS,
                retries={"max_attempts": 2, "mode": "standard"},
            )
            client = boto3.client("scheduler", region_name=region, config=config)
            _clients[region] = client
        return client


def reset_clients() -> None:
    with _clients_lock:
        _clients.clear()


class Scheduling:
    """What makes one-shot schedules needs (Waker here, SafetyNet): the settings, the function
    the schedules invoke (None: none can be made), a Scheduler client, a metric counter."""

    def __init__(
        self,
        settings: Settings,
        target_arn: str | None,
        *,
        client: EventBridgeSchedulerClient | None = None,
        count: Callable[[str, int], None] | None = None,
        controls: Controls = ALL_ON,
    ) -> None:
        self._settings = settings
        self._target = target_arn
        self._client = client
        self._count = count or (lambda _name, _n: None)
        self._controls = controls
        self._creations = 0

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def can_schedule(self) -> bool:
        s = self._settings
        return bool(self._target and s.schedule_group and s.scheduler_role_arn)

    def _scheduler(self) -> EventBridgeSchedulerClient:
        assert self._target
        return self._client or scheduler_client(region_from_arn(self._target))


class Waker(Scheduling):
    """Makes sure of one wake-up of the function at a run's next due moment."""

    def ensure(self, session: Session, due_at: dt.datetime | None, run_id: str) -> WakeOutcome:
        """For the function's queues (PGDRAIN_QUEUES), whichever of them the run drained: every
        run's wake-up is then one of the function's own, pending once. A wake-up for the run's
        own set would start a chain of its own for each set of names that events sent by hand
        carried, renewed by each woken run for as long as work is due in one of them."""
        queues = self._settings.queues
        if due_at is None:
            return WakeOutcome(None, "none")
        # Work already due (a lease that expired while this run found nothing to claim) is
        # woken for at the next step: a schedule cannot fire in the past.
        now = dt.datetime.now(dt.UTC)
        due_at = max(due_at, now + dt.timedelta(seconds=1))
        wake_at = wake_moment(due_at, self._settings.wake_precision_seconds, now)
        if not self.can_schedule:
            log.info("work due later; no schedule here", extra={"wake_at": wake_at.isoformat()})
            return WakeOutcome(wake_at, "reported")
        name = schedule_name(queues, wake_at)
        key = queue_set(queues)
        reserved = session.run(store.wake_reserve, key, wake_at, run_id, WAKE_HOLD_SECONDS)
        if reserved is None:
            log.info("wake-up already pending", extra={"wake_at": wake_at.isoformat()})
            return WakeOutcome(wake_at, "pending")
        action = self._try_create(name, queues, wake_at)
        if action == "failed":  # the later wake-up it replaced, if any, stands again
            session.run(store.wake_release, key, wake_at, run_id, reserved.replaced)
            return WakeOutcome(wake_at, "failed", name)
        session.run(store.wake_created, key, wake_at, run_id)
        return WakeOutcome(wake_at, action, name)

    def ensure_without_database(
        self, queues: Sequence[str] | None, wake_at: dt.datetime
    ) -> WakeOutcome:
        """Create the schedule a kick reserved (pgdrain.aws.kick: the kick recorded it in
        pgdrain.wakes already, and wake_request checked that record), without a run: the run
        it saves would find nothing.
        Safe to repeat (a retried event): the name is deterministic, and a second creation is a
        ConflictException, which is success."""
        name = schedule_name(queues, wake_at)
        action = self._try_create(name, queues, wake_at)
        return WakeOutcome(wake_at, action, name)

    def _try_create(
        self, name: str, queues: Sequence[str] | None, wake_at: dt.datetime
    ) -> WakeAction:
        if self._controls.cap_wake_schedules and self._creations >= MAX_SCHEDULES_PER_WAKER:
            log.error(
                "a second wake-up schedule in one invocation refused",
                extra={"schedule": name, "wake_at": wake_at.isoformat()},
            )
            self._count(WAKE_FAILED_METRIC, 1)
            return "failed"
        self._creations += 1  # an attempt counts: it may have been made before a failure
        try:
            self._create(name, queues, wake_at)
        except Exception as exc:  # any AWS failure: logged and counted, never fails the run
            if not _is_conflict(exc):
                log.error(
                    "could not create the wake-up schedule; the hourly schedule covers it",
                    extra={"schedule": name, "wake_at": wake_at.isoformat(), "error": str(exc)},
                )
                self._count(WAKE_FAILED_METRIC, 1)
                return "failed"
            action: WakeAction = "exists"  # the same wake-up, made by another run: success
        else:
            action = "created"
        self._count(WAKE_CREATED_METRIC, 1 if action == "created" else 0)
        log.info("wake-up scheduled", extra={"schedule": name, "wake_at": wake_at.isoformat()})
        return action

    def _create(self, name: str, queues: Sequence[str] | None, wake_at: dt.datetime) -> None:
        settings = self._settings
        assert self._target and settings.schedule_group and settings.scheduler_role_arn
        self._scheduler().create_schedule(
            Name=name,
            GroupName=settings.schedule_group,
            ScheduleExpression=at_expression(wake_at),
            ScheduleExpressionTimezone="UTC",
            FlexibleTimeWindow={"Mode": "OFF"},
            ActionAfterCompletion="DELETE",
            Description="pgdrain wake-up: work is due in these queues",
            Target={
                "Arn": self._target,
                "RoleArn": settings.scheduler_role_arn,
                "Input": json.dumps(wake_event(None if queues is None else sorted(set(queues)))),
                "RetryPolicy": {
                    "MaximumRetryAttempts": TARGET_RETRY_ATTEMPTS,
                    "MaximumEventAgeInSeconds": TARGET_MAX_EVENT_AGE_SECONDS,
                },
            },
        )


def _is_conflict(exc: Exception) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    return bool(response.get("Error", {}).get("Code") == "ConflictException")
