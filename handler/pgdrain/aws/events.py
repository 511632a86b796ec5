"""The events the drain function understands, parsed into a Trigger; anything else is a BadEvent
with one line saying what is wrong (and no database work is done for it).

The function drains every queue, or those PGDRAIN_QUEUES restricts it to: "the function's
queues" below.

- A schedule: the EventBridge scheduled event ("source": "aws.events") or what an EventBridge
  Scheduler schedule without an Input sends ("source": "aws.scheduler", "detail": "{}").
  Drains the function's queues.
- An enqueue kick, sent by pgdrain.kick() after the application commits:
  {"pgdrain": {"reason": "enqueue", "queues": ["emails"]}}
  The run drains the function's queues. A kicked queue outside them is logged as an error
  (its jobs wait for a function that drains it) and reported in the run's summary.
- A continuation, sent by a run that ran out of time with work left:
  {"pgdrain": {"reason": "continue", "queues": ["emails"], "chain": 3}}
  Without "queues" (here and in the events below): the function's queues, as a run of every
  queue sends them.
- A wake-up, from the one-shot schedule a run created for the moment work is next due:
  {"pgdrain": {"reason": "wake", "queues": ["emails"]}}
- A fan-out run, started by a run that saw more ready work than it could finish in time; `run`
  is the id its spawner reserved for it in pgdrain.runs:
  {"pgdrain": {"reason": "fanout", "queues": ["emails"], "chain": 1, "run": "…"}}
- The sliding safety net's run (pgdrain.aws.safety_net), a scheduled run in every way:
  {"pgdrain": {"reason": "safety"}}
  Drains the function's queues.
- A wake-up request, sent by pgdrain.kick() for a kicked delayed job when nothing is ready:
  make sure a wake-up comes at `at` (the job's run_at), without a run now that would find
  nothing; `reserved_by` is the id the kick recorded that wake-up under in pgdrain.wakes:
  {"pgdrain": {"reason": "later", "queues": ["emails"], "at": "2026-12-01T14:05:00+00:00",
               "reserved_by": "kick:…"}}
The hop count (`chain`) grows by one with each continuation or fan-out (Lambda stops chains of
functions invoking themselves after about 16 hops); a schedule, kick or wake-up starts at 0.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from pgdrain.api import jsonbound
from pgdrain.errors import BadEvent, BadInput, ConfigError
from pgdrain.settings import MAX_QUEUES, Settings, check_queue_name, describe_queues, serves

TriggerReason = Literal["schedule", "safety", "enqueue", "continue", "wake", "fanout", "later"]
SCHEDULE: TriggerReason = "schedule"
SAFETY: TriggerReason = "safety"
ENQUEUE: TriggerReason = "enqueue"
CONTINUE: TriggerReason = "continue"
WAKE: TriggerReason = "wake"
FANOUT: TriggerReason = "fanout"
LATER: TriggerReason = "later"
EXPECTED_REASONS = "'enqueue', 'continue', 'wake', 'fanout', 'later' or 'safety'"
SCHEDULE_SOURCES = ("aws.events", "aws.scheduler")
SCHEDULE_DETAIL_TYPE = "Scheduled Event"
# A real event is a few hundred bytes; an async invoke may carry up to 1 MB.
MAX_EVENT_BYTES = 16 * 1024
MAX_CHAIN = 10_000  # a sanity bound on the field; PGDRAIN_MAX_CHAIN decides what continues
MAX_ID_LENGTH = 128
RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}\Z")


class Trigger(NamedTuple):
    """Why this run started and what it drains."""

    reason: TriggerReason
    queues: tuple[str, ...] | None  # None: every queue
    chain: int = 0  # hops so far (continuations, fan-out): 0 for a schedule, kick or wake
    event_id: str | None = None  # the EventBridge event id, used as the correlation id
    run_id: str | None = None  # a fan-out run: the id its spawner reserved in pgdrain.runs
    wake_at: dt.datetime | None = None  # a wake-up request: when its wake-up is due
    reserved_by: str | None = None  # a wake-up request: its id in pgdrain.wakes
    # A kick: the queues it named that this function does not drain (PGDRAIN_QUEUES).
    unserved: tuple[str, ...] = ()

    @property
    def housekeeping(self) -> bool:
        """A scheduled run (the rate schedule's or the safety net's): it keeps part of its
        budget for retention and syncs the queue limits."""
        return self.reason in (SCHEDULE, SAFETY)


def parse(event: object, settings: Settings) -> Trigger:
    """The Trigger an event asks for, or BadEvent."""
    if not isinstance(event, dict):
        raise BadEvent(f"the event is {_kind(event)}, not a JSON object")
    try:
        jsonbound.check_value_depth(event, "the event")  # before json.dumps, which would recurse
    except BadInput as exc:
        raise BadEvent(str(exc)) from None
    size = _size(event)
    if size > MAX_EVENT_BYTES:
        raise BadEvent(f"the event is {size} bytes; the limit is {MAX_EVENT_BYTES}")
    if "pgdrain" in event:
        return _parse_pgdrain(event, settings)
    if event.get("detail-type") == SCHEDULE_DETAIL_TYPE and event.get("source") in SCHEDULE_SOURCES:
        return _parse_schedule(event, settings)
    keys = ", ".join(sorted(str(k) for k in event)[:5]) or "no keys"
    raise BadEvent(
        f"unknown event ({keys}): expected a scheduled event or a "
        '{"pgdrain": {"reason": ...}} event'
    )


def correlation_id(event: object) -> str | None:
    """The EventBridge event id, when the event carries a plausible one."""
    if isinstance(event, dict):
        value = event.get("id")
        if isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH:
            return value
    return None


def enqueue_event(queues: Sequence[str]) -> dict[str, Any]:
    return {"pgdrain": {"reason": ENQUEUE, "queues": list(queues)}}


def _with_queues(body: dict[str, Any], queues: Sequence[str] | None) -> dict[str, Any]:
    """The event, naming its queues; none named (a run of every queue): the function's."""
    return {"pgdrain": body if queues is None else body | {"queues": list(queues)}}


def continue_event(queues: Sequence[str] | None, chain: int) -> dict[str, Any]:
    return _with_queues({"reason": CONTINUE, "chain": chain}, queues)


def wake_event(queues: Sequence[str] | None) -> dict[str, Any]:
    return _with_queues({"reason": WAKE}, queues)


def fanout_event(queues: Sequence[str] | None, chain: int, run_id: str) -> dict[str, Any]:
    return _with_queues({"reason": FANOUT, "chain": chain, "run": run_id}, queues)


def safety_event() -> dict[str, Any]:
    return {"pgdrain": {"reason": SAFETY}}


def later_event(
    queues: Sequence[str] | None, wake_at: dt.datetime, reserved_by: str
) -> dict[str, Any]:
    return _with_queues(
        {"reason": LATER, "at": wake_at.isoformat(), "reserved_by": reserved_by}, queues
    )


def _parse_schedule(event: dict[str, Any], settings: Settings) -> Trigger:
    detail = event.get("detail", {})
    if isinstance(detail, str):  # EventBridge Scheduler sends the detail as the string "{}"
        try:
            detail = jsonbound.loads(detail, "scheduled event: 'detail'")
        except BadInput as exc:
            raise BadEvent(str(exc)) from None
    if not isinstance(detail, dict):
        raise BadEvent(f"scheduled event: 'detail' is {_kind(detail)}, not an object")
    return Trigger(SCHEDULE, settings.queues, 0, correlation_id(event))


def _parse_pgdrain(event: dict[str, Any], settings: Settings) -> Trigger:
    extra = sorted(str(k) for k in event if k != "pgdrain")
    if extra:
        raise BadEvent(f"pgdrain event: unexpected top-level key(s) {', '.join(extra)}")
    body = event["pgdrain"]
    if not isinstance(body, dict):
        raise BadEvent(f"pgdrain event: 'pgdrain' is {_kind(body)}, not an object")
    reason = body.get("reason")
    if reason == ENQUEUE:
        _only_keys(body, ("reason", "queues"))
        kicked = _names(body)
        # A kicked run drains every queue of the function, as a scheduled one does: runs are
        # interchangeable, so the runs PGDRAIN_MAX_RUNS allows serve every queue (round-robin,
        # per-queue limits), and a queue kicked while they all work on another is served by
        # them instead of waiting for a free place (its kick invokes nothing: they hold it).
        # A kicked queue the function does not drain is said (run.py), not a reason to leave
        # the others' jobs waiting.
        outside = tuple(n for n in kicked if not serves(settings.queues, n))
        return Trigger(ENQUEUE, settings.queues, unserved=outside)
    if reason == CONTINUE:
        _only_keys(body, ("reason", "queues", "chain"))
        return Trigger(CONTINUE, _queues(body, settings), _chain(body))
    if reason == WAKE:
        _only_keys(body, ("reason", "queues"))
        return Trigger(WAKE, _queues(body, settings))
    if reason == FANOUT:
        _only_keys(body, ("reason", "queues", "chain", "run"))
        return Trigger(FANOUT, _queues(body, settings), _chain(body), run_id=_run_id(body))
    if reason == SAFETY:
        _only_keys(body, ("reason",))
        return Trigger(SAFETY, settings.queues)
    if reason == LATER:
        _only_keys(body, ("reason", "queues", "at", "reserved_by"))
        queues = _queues(body, settings)
        reserved_by = _run_id(body, "reserved_by")
        wake_at = _moment(body)
        _on_the_precision(wake_at, settings.wake_precision_seconds)
        return Trigger(LATER, queues, wake_at=wake_at, reserved_by=reserved_by)
    if not isinstance(reason, str):
        raise BadEvent(f"pgdrain event: 'reason' is {_kind(reason)}; expected {EXPECTED_REASONS}")
    raise BadEvent(f"pgdrain event: unknown reason {reason[:40]!r}; expected {EXPECTED_REASONS}")


def _only_keys(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(str(k) for k in body if k not in allowed)
    if extra:
        raise BadEvent(f"pgdrain {body['reason']} event: unexpected key(s) {', '.join(extra)}")


def _queues(body: dict[str, Any], settings: Settings) -> tuple[str, ...] | None:
    """The queues an event of the function's own names (they must be among those it drains),
    or, without "queues", the function's queues (None: every queue)."""
    if "queues" not in body:
        return settings.queues
    names = _names(body)
    outside = [n for n in names if not serves(settings.queues, n)]
    if outside:
        raise BadEvent(
            f"pgdrain {body['reason']} event: queue {outside[0]!r} is not drained by this "
            f"function (PGDRAIN_QUEUES={describe_queues(settings.queues)})"
        )
    return names


def _names(body: dict[str, Any]) -> tuple[str, ...]:
    where = f"pgdrain {body['reason']} event"
    raw = body.get("queues")
    if not isinstance(raw, list) or not raw:
        raise BadEvent(f"{where}: 'queues' must be a non-empty list of queue names")
    if len(raw) > MAX_QUEUES:
        raise BadEvent(f"{where}: {len(raw)} queues; at most {MAX_QUEUES}")
    names: list[str] = []
    for item in raw:
        if not isinstance(item, str):
            raise BadEvent(f"{where}: a queue name is {_kind(item)}, not a string")
        try:
            names.append(check_queue_name(item, where))
        except ConfigError as exc:
            raise BadEvent(str(exc)) from None
    return tuple(dict.fromkeys(names))


def _chain(body: dict[str, Any]) -> int:
    where = f"pgdrain {body['reason']} event"
    chain = body.get("chain")
    if isinstance(chain, bool) or not isinstance(chain, int):
        raise BadEvent(f"{where}: 'chain' is {_kind(chain)}, not a whole number")
    if not 1 <= chain <= MAX_CHAIN:
        raise BadEvent(f"{where}: 'chain' must be from 1 to {MAX_CHAIN}")
    return chain


def _run_id(body: dict[str, Any], key: str = "run") -> str:
    run_id = body.get(key)
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise BadEvent(
            f"pgdrain {body['reason']} event: {key!r} must be a run id (letters, digits, "
            "'_.:-'; at most 128 characters)"
        )
    return run_id


def _moment(body: dict[str, Any]) -> dt.datetime:
    where = f"pgdrain {body['reason']} event"
    raw = body.get("at")
    if not isinstance(raw, str) or len(raw) > 40:
        raise BadEvent(f"{where}: 'at' must be an ISO 8601 time with its UTC offset")
    try:
        moment = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise BadEvent(f"{where}: 'at' is not an ISO 8601 time: {raw!r}") from None
    if moment.tzinfo is None:
        raise BadEvent(f"{where}: 'at' has no UTC offset: {raw!r}")
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:  # its offset takes it past year 1 or 9999
        raise BadEvent(f"{where}: 'at' is out of range in UTC: {raw!r}") from None


def _on_the_precision(moment: dt.datetime, precision_seconds: float) -> None:
    """A kick asks for a wake-up at a moment rounded up to the precision (wake.wake_time): any
    other moment was not sent by a kick."""
    steps = moment.timestamp() / precision_seconds
    if abs(steps - round(steps)) > 1e-6:
        raise BadEvent(
            f"pgdrain later event: 'at' is not a wake-up moment (a whole multiple of "
            f"{precision_seconds:g} s since the epoch)"
        )


def _size(event: dict[str, Any]) -> int:
    try:
        return len(json.dumps(event, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError):
        raise BadEvent("the event is not plain JSON") from None


def _kind(value: object) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)
