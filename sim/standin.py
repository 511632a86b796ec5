"""The stand-in for the AWS control plane: an HTTP server on 127.0.0.1 speaking the rest-json
wire protocols botocore uses (botocore/data/lambda/2015-03-31, scheduler/2021-06-30), and the
machinery behind them, in scaled real time.

Lambda `Invoke` (POST /2015-03-31/functions/{FunctionName}/invocations):
- InvocationType Event: 202, the event is queued and run in an execution environment. A run
  beyond the concurrency cap is throttled and retried later, with backoff, until
  MaximumEventAgeInSeconds; a function error or a timeout (SIGKILL at the deadline) is retried
  MaximumRetryAttempts times, about 1 and then 2 minutes later, as template.yaml configures.
- RequestResponse: runs it now and returns the handler's result, or 429
  TooManyRequestsException beyond the cap. DryRun: 204.
EventBridge Scheduler (/schedules/{Name}): CreateSchedule of a one-shot `at(...)` schedule
(UTC) with Target.Arn/RoleArn/Input, in a group (ConflictException for a name that exists in
it); UpdateSchedule (PUT: the same, replacing one that exists); GetSchedule; DeleteSchedule.
A one-shot schedule fires at its time, which the one-minute precision (scaled) rounds up, and
is deleted after it fires when ActionAfterCompletion is DELETE.
The rate schedule (template.yaml's ScheduleV2) fires a scheduled event every rate, the first one
a rate after the trace starts.
Faults on request: every Nth async event delivered twice, and every fan-out event (a run's
{"reason": "fanout"} invoke) delivered twice; Invoke failing with HTTP 500 or
throttled (429), or CreateSchedule failing with HTTP 500, during given windows of simulated
time; and the scheduler refused altogether (AccessDenied), for a system that must have no
one-shot schedules."""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from sim.launcher import Outcome, Pool
from sim.template import REGION, WAKE_PRECISION_SECONDS
from sim.timescale import Scale

ACCOUNT = "123456789012"
INVOKE_PATH = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")
SCHEDULE_PATH = re.compile(r"^/schedules/([^/]+)$")
AT_EXPRESSION = re.compile(r"^at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)$")
DUPLICATE_DELAY_S = 2.0  # a duplicate delivery arrives this long (simulated) after the first
THROTTLE_FIRST_RETRY_S = 1.0  # Lambda retries a throttled async event with growing backoff
THROTTLE_MAX_RETRY_S = 300.0
RETRY_DELAYS_S = (60.0, 120.0)  # a failed async event is retried ~1, then ~2 minutes later

Window = tuple[float, float]  # [start, end) in simulated seconds of the trace


@dataclass(frozen=True)
class Faults:
    duplicate_every: int = 0  # every Nth accepted async event is delivered twice (0: never)
    duplicate_fanout: bool = False  # every fan-out event is delivered twice
    invoke_fail: tuple[Window, ...] = ()  # Invoke returns 500 ServiceException meanwhile
    invoke_throttle: tuple[Window, ...] = ()  # Invoke returns 429 TooManyRequestsException
    create_schedule_fail: tuple[Window, ...] = ()  # CreateSchedule returns 500 meanwhile


@dataclass(frozen=True)
class PlaneConfig:
    function_name: str
    function_arn: str
    timeout_s: float
    concurrency: int
    max_retry_attempts: int
    max_event_age_s: float
    rate_s: float | None  # the rate schedule; None: none
    scheduler_enabled: bool = True
    faults: Faults = Faults()


@dataclass
class Event:
    payload: Any
    source: str  # kick/invoke, schedule, wake, duplicate, retry...
    received: float  # real epoch
    retries: int = 0
    throttles: int = 0


@dataclass
class Counters:
    invoke_calls: int = 0
    invoke_failed: int = 0  # injected 500s and 429s
    accepted: int = 0
    duplicates: int = 0
    throttled: int = 0
    dropped: int = 0  # too old after throttling or retries
    invocations: int = 0
    errors: int = 0
    timeouts: int = 0
    retries: int = 0
    schedules_created: int = 0
    schedules_updated: int = 0
    schedule_conflicts: int = 0
    schedule_failed: int = 0  # injected 500s and refusals
    schedules_fired: int = 0
    rate_fired: int = 0
    peak_runs: int = 0


@dataclass
class Schedule:
    name: str
    group: str
    expression: str
    fire_at: float  # real epoch
    target_arn: str
    role_arn: str
    payload: Any
    delete_after: bool
    fired: bool = False


@dataclass
class Invocation:
    started: float
    ended: float
    source: str
    status: str
    env_id: str


class ControlPlane:
    def __init__(self, config: PlaneConfig, scale: Scale, pool: Pool) -> None:
        self.config, self.scale, self.pool = config, scale, pool
        self.counters = Counters()
        self.invocations: list[Invocation] = []
        self.kills: dict[str, float] = {}  # environment id -> real time of its SIGKILL
        self.schedules: dict[tuple[str, str], Schedule] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._running = 0
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.plane = self  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self, scale: Scale) -> None:
        """Serve, and fire the rate schedule from the trace's start (scale.origin) on."""
        self.scale = scale
        for target in (self._server.serve_forever, self._timer_loop):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
        if self.config.rate_s:
            self._after(self.scale.at(self.config.rate_s), self._fire_rate)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self.pool.close()  # kills whatever still runs: the trace is over
        for thread in list(self._threads):
            thread.join(timeout=5)

    # -- time --------------------------------------------------------------------------------

    def _after(self, when: float, action: Callable[[], None]) -> None:
        with self._lock:
            heapq.heappush(self._timers, (when, next(self._seq), action))
            self._wake.notify_all()

    def _later(self, sim_seconds: float, action: Callable[[], None]) -> None:
        self._after(time.time() + self.scale.real(sim_seconds), action)

    def _timer_loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopped and (not self._timers or self._timers[0][0] > time.time()):
                    timeout = self._timers[0][0] - time.time() if self._timers else None
                    self._wake.wait(timeout)
                if self._stopped:
                    return
                _, _, action = heapq.heappop(self._timers)
            action()

    def _in_window(self, windows: tuple[Window, ...]) -> bool:
        now = self.scale.now()
        return any(start <= now < end for start, end in windows)

    # -- Lambda ------------------------------------------------------------------------------

    def accept(self, payload: Any, source: str) -> None:
        """An asynchronous event accepted (202): run it, and again if a duplicate is due."""
        with self._lock:
            self.counters.accepted += 1
            faults = self.config.faults
            duplicate = (
                faults.duplicate_every > 0 and self.counters.accepted % faults.duplicate_every == 0
            ) or (faults.duplicate_fanout and _reason(payload) == "fanout")
        self._dispatch(Event(payload, source, time.time()))
        if duplicate:
            with self._lock:
                self.counters.duplicates += 1
            copy = Event(payload, "duplicate", time.time())
            self._later(DUPLICATE_DELAY_S, lambda: self._dispatch(copy))

    def _dispatch(self, event: Event) -> None:
        with self._lock:
            if self._stopped:
                return
            if self._running >= self.config.concurrency:
                self.counters.throttled += 1
                event.throttles += 1
                throttled = True
            else:
                self._running += 1
                self.counters.peak_runs = max(self.counters.peak_runs, self._running)
                throttled = False
        if throttled:
            delay = min(THROTTLE_MAX_RETRY_S, THROTTLE_FIRST_RETRY_S * 2 ** (event.throttles - 1))
            self._retry_later(event, delay)
            return
        thread = threading.Thread(target=self._run_async, args=(event,), daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _retry_later(self, event: Event, delay_s: float) -> None:
        age_s = self.scale.sim(time.time() - event.received) + delay_s
        if age_s > self.config.max_event_age_s:
            with self._lock:
                self.counters.dropped += 1
            return
        self._later(delay_s, lambda: self._dispatch(event))

    def _run_async(self, event: Event) -> None:
        try:
            outcome = self._execute(event.payload, event.source)
        finally:
            with self._lock:
                self._running -= 1
        if outcome.status == "ok" or self._stopped:
            return
        if event.retries < min(self.config.max_retry_attempts, len(RETRY_DELAYS_S)):
            delay = RETRY_DELAYS_S[event.retries]
            event.retries += 1
            with self._lock:
                self.counters.retries += 1
            retry = Event(event.payload, "retry", event.received, event.retries)
            self._retry_later(retry, delay)

    def _execute(self, payload: Any, source: str) -> Outcome:
        """Run one invocation in an environment; the caller holds a concurrency slot."""
        environment = self.pool.acquire()
        if environment is None:
            return Outcome("crash", "the execution environment failed to start", time.time())
        started = time.time()
        deadline = started + self.scale.real(self.config.timeout_s)
        message = {
            "event": payload,
            "deadline": deadline,
            "request_id": str(uuid.uuid4()),
            "function_arn": self.config.function_arn,
        }
        with self._lock:
            self.counters.invocations += 1
        outcome = environment.invoke(message, deadline)
        with self._lock:
            if outcome.status == "timeout":
                self.counters.timeouts += 1
                self.kills[environment.env_id] = outcome.ended_at
            elif outcome.status != "ok":
                self.counters.errors += 1
            self.invocations.append(
                Invocation(started, outcome.ended_at, source, outcome.status, environment.env_id)
            )
        self.pool.release(environment)
        return outcome

    def invoke_sync(self, payload: Any) -> Outcome | None:
        """RequestResponse: None when throttled."""
        with self._lock:
            if self._running >= self.config.concurrency:
                self.counters.throttled += 1
                return None
            self._running += 1
            self.counters.peak_runs = max(self.counters.peak_runs, self._running)
        try:
            return self._execute(payload, "sync")
        finally:
            with self._lock:
                self._running -= 1

    def _fire_rate(self) -> None:
        with self._lock:
            self.counters.rate_fired += 1
        self.accept(scheduled_event(f"{self.config.function_name}-schedule"), "schedule")
        assert self.config.rate_s is not None
        self._later(self.config.rate_s, self._fire_rate)

    # -- EventBridge Scheduler ---------------------------------------------------------------

    def create_schedule(
        self, name: str, body: dict[str, Any], *, replace: bool = False
    ) -> tuple[int, dict[str, Any]]:
        if not self.config.scheduler_enabled:
            with self._lock:
                self.counters.schedule_failed += 1
            return 403, _error("AccessDeniedException", "this system has no one-shot schedules")
        if self._in_window(self.config.faults.create_schedule_fail):
            with self._lock:
                self.counters.schedule_failed += 1
            return 500, _error("InternalServerException", "injected fault")
        group = str(body.get("GroupName") or "default")
        expression = str(body.get("ScheduleExpression", ""))
        zone = body.get("ScheduleExpressionTimezone") or "UTC"
        match = AT_EXPRESSION.match(expression)
        if match is None or zone not in ("UTC", "Etc/UTC"):
            return 400, _error(
                "ValidationException",
                "the stand-in supports one-shot at(yyyy-mm-ddThh:mm:ss) schedules in UTC",
            )
        target = body.get("Target") or {}
        if not isinstance(target, dict) or not target.get("RoleArn"):
            return 400, _error("ValidationException", "Target.Arn and Target.RoleArn are required")
        if not _names_function(str(target.get("Arn", "")), self.config.function_name):
            return 400, _error("ValidationException", "the target is not the drain function")
        when = dt.datetime.fromisoformat(match.group(1)).replace(tzinfo=dt.UTC).timestamp()
        precision = self.scale.real(WAKE_PRECISION_SECONDS)
        fire_at = math.ceil(when / precision - 1e-9) * precision
        raw_input = target.get("Input")
        payload = json.loads(raw_input) if isinstance(raw_input, str) else scheduled_event(name)
        schedule = Schedule(
            name=name,
            group=group,
            expression=expression,
            fire_at=fire_at,
            target_arn=str(target["Arn"]),
            role_arn=str(target["RoleArn"]),
            payload=payload,
            delete_after=body.get("ActionAfterCompletion") == "DELETE",
        )
        with self._lock:
            exists = (group, name) in self.schedules
            if exists and not replace:
                self.counters.schedule_conflicts += 1
                return 409, _error("ConflictException", f"Schedule {name} already exists.")
            if replace and not exists:
                return 404, _error("ResourceNotFoundException", f"Schedule {name} does not exist.")
            self.schedules[(group, name)] = schedule
            if replace:
                self.counters.schedules_updated += 1
            else:
                self.counters.schedules_created += 1
        self._after(max(fire_at, time.time()), lambda: self._fire_schedule(schedule))
        return 200, {"ScheduleArn": _schedule_arn(group, name)}

    def update_schedule(self, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """UpdateSchedule replaces the whole definition of an existing schedule (its old time
        no longer fires)."""
        return self.create_schedule(name, body, replace=True)

    def _fire_schedule(self, schedule: Schedule) -> None:
        key = (schedule.group, schedule.name)
        with self._lock:
            if self.schedules.get(key) is not schedule:
                return  # deleted (or replaced) before its time
            schedule.fired = True
            self.counters.schedules_fired += 1
            if schedule.delete_after:
                del self.schedules[key]
        self.accept(schedule.payload, "wake")

    def get_schedule(self, name: str, group: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            schedule = self.schedules.get((group, name))
        if schedule is None:
            return 404, _error("ResourceNotFoundException", f"Schedule {name} does not exist.")
        return 200, {
            "Arn": _schedule_arn(group, name),
            "Name": name,
            "GroupName": group,
            "ScheduleExpression": schedule.expression,
            "State": "ENABLED",
            "ActionAfterCompletion": "DELETE" if schedule.delete_after else "NONE",
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "Target": {
                "Arn": schedule.target_arn,
                "RoleArn": schedule.role_arn,
                "Input": json.dumps(schedule.payload),
            },
        }

    def delete_schedule(self, name: str, group: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self.schedules.pop((group, name), None) is None:
                return 404, _error("ResourceNotFoundException", f"Schedule {name} does not exist.")
        return 200, {}


def scheduled_event(schedule_name: str) -> dict[str, Any]:
    """What an EventBridge Scheduler schedule without an Input sends to a Lambda target."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": ACCOUNT,
        "time": now,
        "region": REGION,
        "resources": [f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/default/{schedule_name}"],
        "detail": "{}",
    }


def _schedule_arn(group: str, name: str) -> str:
    return f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/{group}/{name}"


def _names_function(reference: str, function_name: str) -> bool:
    """A function name, a full or partial ARN, with or without a qualifier."""
    parts = reference.split(":")
    if "function" in parts:
        index = parts.index("function")
        return len(parts) > index + 1 and parts[index + 1] == function_name
    return parts[0] == function_name


def _throttle(message: str) -> dict[str, Any]:
    document = _error("TooManyRequestsException", message)
    return document | {
        "Type": "User",
        "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded",
    }


def _error(code: str, message: str) -> dict[str, Any]:
    return {"__type": code, "Message": message, "message": message}


class _Handler(BaseHTTPRequestHandler):
    server_version = "pgdrain-sim"

    @property
    def plane(self) -> ControlPlane:
        return self.server.plane  # type: ignore[attr-defined, no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        path, _ = self._target()
        body = self._body()
        invoke = INVOKE_PATH.match(path)
        if invoke:
            self._invoke(unquote(invoke.group(1)), body)
            return
        schedule = SCHEDULE_PATH.match(path)
        if schedule:
            try:
                document = json.loads(body or b"{}")
            except json.JSONDecodeError:
                self._json(400, _error("ValidationException", "the body is not JSON"))
                return
            self._json(*self.plane.create_schedule(unquote(schedule.group(1)), document))
            return
        self._json(404, _error("UnknownOperationException", f"no operation at {path}"))

    def do_PUT(self) -> None:
        path, _ = self._target()
        schedule = SCHEDULE_PATH.match(path)
        if schedule:
            try:
                document = json.loads(self._body() or b"{}")
            except json.JSONDecodeError:
                self._json(400, _error("ValidationException", "the body is not JSON"))
                return
            self._json(*self.plane.update_schedule(unquote(schedule.group(1)), document))
            return
        self._json(404, _error("UnknownOperationException", f"no operation at {path}"))

    def do_GET(self) -> None:
        path, query = self._target()
        schedule = SCHEDULE_PATH.match(path)
        if schedule:
            group = query.get("groupName", ["default"])[0]
            self._json(*self.plane.get_schedule(unquote(schedule.group(1)), group))
            return
        self._json(404, _error("UnknownOperationException", f"no operation at {path}"))

    def do_DELETE(self) -> None:
        path, query = self._target()
        schedule = SCHEDULE_PATH.match(path)
        if schedule:
            group = query.get("groupName", ["default"])[0]
            self._json(*self.plane.delete_schedule(unquote(schedule.group(1)), group))
            return
        self._json(404, _error("UnknownOperationException", f"no operation at {path}"))

    def _invoke(self, function: str, body: bytes) -> None:
        plane = self.plane
        with plane._lock:
            plane.counters.invoke_calls += 1
        if not _names_function(function, plane.config.function_name):
            self._json(404, _error("ResourceNotFoundException", f"Function not found: {function}"))
            return
        if plane._in_window(plane.config.faults.invoke_fail):
            with plane._lock:
                plane.counters.invoke_failed += 1
            self._json(500, {**_error("ServiceException", "injected fault"), "Type": "Service"})
            return
        if plane._in_window(plane.config.faults.invoke_throttle):
            with plane._lock:
                plane.counters.invoke_failed += 1
            self._json(429, _throttle("injected fault: Rate Exceeded."))
            return
        try:
            payload = json.loads(body or b"{}")
        except json.JSONDecodeError:
            self._json(400, _error("InvalidRequestContentException", "the payload is not JSON"))
            return
        kind = self.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        if kind == "DryRun":
            self._reply(204, b"", {})
        elif kind == "Event":
            plane.accept(payload, "invoke")
            self._reply(202, b"", {})
        else:
            outcome = plane.invoke_sync(payload)
            if outcome is None:
                self._json(429, _throttle("Rate Exceeded."))
                return
            headers = {} if outcome.status == "ok" else {"X-Amz-Function-Error": "Unhandled"}
            self._reply(200, json.dumps(outcome.payload, default=str).encode(), headers)

    def _target(self) -> tuple[str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        return parts.path, parse_qs(parts.query)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, status: int, document: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json"}
        if status >= 400 and "__type" in document:
            headers["x-amzn-ErrorType"] = str(document["__type"])
        self._reply(status, json.dumps(document).encode(), headers)

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        if body:
            self.wfile.write(body)


def _reason(payload: Any) -> str | None:
    """A pgdrain event's reason ("fanout", "enqueue"...), or None for another event."""
    body = payload.get("pgdrain") if isinstance(payload, dict) else None
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason if isinstance(reason, str) else None
