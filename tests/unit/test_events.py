"""pgdrain.aws.events: the three events the function understands, and a one-line BadEvent for
anything else."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from pgdrain.aws import events
from pgdrain.errors import BadEvent
from pgdrain.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(queues=("default", "emails", "sms"))

RULE_EVENT = {
    "version": "0",
    "id": "cdc73f9d-aea9-11e3-9d5a-835b769c0d9c",
    "detail-type": "Scheduled Event",
    "source": "aws.events",
    "account": "123456789012",
    "time": "1970-01-01T00:00:00Z",
    "region": "us-east-1",
    "resources": ["arn:aws:events:us-east-1:123456789012:rule/ExampleRule"],
    "detail": {},
}
# What an EventBridge Scheduler schedule with no Input (SAM's ScheduleV2) sends a Lambda target.
SCHEDULER_EVENT = {
    **RULE_EVENT,
    "id": "d167b752-343a-4b28-afd6-d4de056319e8",
    "source": "aws.scheduler",
    "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/drain"],
    "detail": "{}",
}


@pytest.mark.parametrize("event", [RULE_EVENT, SCHEDULER_EVENT], ids=["rule", "scheduler"])
def test_a_scheduled_event_drains_every_configured_queue(event: dict[str, Any]) -> None:
    trigger = events.parse(event, SETTINGS)
    assert trigger == events.Trigger("schedule", ("default", "emails", "sms"), 0, event["id"])


def test_the_sample_events_parse() -> None:
    folder = ROOT / "infra" / "events"
    parsed = {
        name: events.parse(json.loads((folder / f"{name}.json").read_text()), SETTINGS)
        for name in ("schedule", "enqueue", "continue", "wake")
    }
    assert [t.reason for t in parsed.values()] == ["schedule", "enqueue", "continue", "wake"]
    assert parsed["continue"].chain == 1


def test_an_enqueue_kick_names_its_queues_and_drains_all_of_the_functions() -> None:
    event = events.enqueue_event(["emails", "sms", "emails"])
    assert events.parse(event, SETTINGS) == events.Trigger("enqueue", SETTINGS.queues)


def test_a_kick_of_a_queue_the_function_does_not_drain_runs_and_names_it() -> None:
    """The kicked queues it drains are not left waiting; the one it does not drain is said
    (run.py logs it as an error, and the run's summary counts its ready jobs)."""
    event = events.enqueue_event(["emails", "payments"])
    trigger = events.parse(event, SETTINGS)
    assert trigger == events.Trigger("enqueue", SETTINGS.queues, unserved=("payments",))


EVERY = Settings()  # PGDRAIN_QUEUES unset: every queue


def test_unrestricted_a_function_drains_every_queue_whatever_it_is_woken_for() -> None:
    assert events.parse(RULE_EVENT, EVERY).queues is None
    assert events.parse(events.enqueue_event(["payments"]), EVERY) == events.Trigger(
        "enqueue", None
    )
    assert events.parse(events.safety_event(), EVERY).queues is None


@pytest.mark.parametrize(
    "event",
    [
        events.continue_event(None, 2),
        events.wake_event(None),
        events.fanout_event(None, 1, "run-1"),
    ],
    ids=["continue", "wake", "fanout"],
)
def test_a_run_of_every_queue_sends_events_without_queues_and_they_mean_every_queue(
    event: dict[str, Any],
) -> None:
    assert "queues" not in event["pgdrain"]
    assert events.parse(event, EVERY).queues is None
    # A restricted function reads them as its own queues.
    assert events.parse(event, SETTINGS).queues == SETTINGS.queues


def test_a_continuation_carries_its_chain() -> None:
    event = events.continue_event(["emails"], 3)
    assert event == {"pgdrain": {"reason": "continue", "queues": ["emails"], "chain": 3}}
    assert events.parse(event, SETTINGS) == events.Trigger("continue", ("emails",), 3)


def test_a_wake_up_starts_a_chain_of_its_own() -> None:
    event = events.wake_event(["emails", "sms"])
    assert event == {"pgdrain": {"reason": "wake", "queues": ["emails", "sms"]}}
    assert events.parse(event, SETTINGS) == events.Trigger("wake", ("emails", "sms"))


def test_a_fanout_run_carries_its_chain_and_its_reserved_id() -> None:
    event = events.fanout_event(["emails"], 2, "5d1c2a9e-7f3b-4c55-9f0e-0b1f0c8a6e21")
    assert events.parse(event, SETTINGS) == events.Trigger(
        "fanout", ("emails",), 2, run_id="5d1c2a9e-7f3b-4c55-9f0e-0b1f0c8a6e21"
    )


def test_a_wake_up_request_carries_its_moment_in_utc_and_its_reservation() -> None:
    at = dt.datetime(2026, 12, 1, 14, 5, tzinfo=dt.UTC)
    event = events.later_event(["emails"], at, "kick:1f0c")
    assert event == {
        "pgdrain": {
            "reason": "later",
            "queues": ["emails"],
            "at": "2026-12-01T14:05:00+00:00",
            "reserved_by": "kick:1f0c",
        }
    }
    assert events.parse(event, SETTINGS) == events.Trigger(
        "later", ("emails",), wake_at=at, reserved_by="kick:1f0c"
    )
    elsewhere = _later(at="2026-12-01T15:05:00+01:00")  # the same moment, another offset
    assert events.parse(elsewhere, SETTINGS).wake_at == at


def _later(**body: Any) -> dict[str, Any]:
    at = "2026-12-01T14:05:00+00:00"
    return {
        "pgdrain": {"reason": "later", "queues": ["emails"], "at": at, "reserved_by": "k", **body}
    }


def _fanout(**body: Any) -> dict[str, Any]:
    return {"pgdrain": {"reason": "fanout", "queues": ["emails"], "chain": 1, **body}}


def _kick(**body: Any) -> dict[str, Any]:
    return {"pgdrain": {"reason": "enqueue", "queues": ["emails"], **body}}


def _continue(chain: Any) -> dict[str, Any]:
    return {"pgdrain": {"reason": "continue", "queues": ["emails"], "chain": chain}}


BAD: list[tuple[str, Any, str]] = [
    ("not a dict", "drain", "the event is a string, not a JSON object"),
    ("a list", [RULE_EVENT], "the event is a list, not a JSON object"),
    ("null", None, "the event is null, not a JSON object"),
    ("a number", 7, "the event is a number, not a JSON object"),
    ("empty", {}, "unknown event (no keys)"),
    ("other service", {"Records": []}, "unknown event (Records)"),
    ("wrong source", {**RULE_EVENT, "source": "my.app"}, "unknown event"),
    ("detail a list", {**RULE_EVENT, "detail": []}, "'detail' is a list, not an object"),
    ("detail bad json", {**SCHEDULER_EVENT, "detail": "{"}, "'detail' is not valid JSON"),
    (
        "detail a huge integer",  # past Python's 4300 digits: was a ValueError escaping parse
        {**SCHEDULER_EVENT, "detail": '{"n": ' + "9" * 5_000 + "}"},
        "'detail' cannot be read: Exceeds the limit (4300 digits)",
    ),
    ("body a string", {"pgdrain": "enqueue"}, "'pgdrain' is a string, not an object"),
    ("extra top key", {**_kick(), "extra": 1}, "unexpected top-level key(s) extra"),
    ("no reason", {"pgdrain": {"queues": ["emails"]}}, "'reason' is null"),
    ("reason a number", {"pgdrain": {"reason": 1}}, "'reason' is a number"),
    ("unknown reason", {"pgdrain": {"reason": "nuke"}}, "unknown reason 'nuke'"),
    ("no queues", {"pgdrain": {"reason": "enqueue"}}, "'queues' must be a non-empty list"),
    ("queues a string", _kick(queues="emails"), "'queues' must be a non-empty list"),
    ("queues empty", _kick(queues=[]), "'queues' must be a non-empty list"),
    ("queue a number", _kick(queues=[1]), "a queue name is a number, not a string"),
    ("queue with a quote", _kick(queues=["a'b"]), "is not a queue name"),
    ("queue with spaces", _kick(queues=["two words"]), "is not a queue name"),
    ("queue too long", _kick(queues=["q" * 64]), "is not a queue name"),
    (
        "wake-up of a queue not drained here",
        {"pgdrain": {"reason": "wake", "queues": ["payments"]}},
        "'payments' is not drained by this",
    ),
    ("too many queues", _kick(queues=["emails"] * 101), "101 queues; at most 100"),
    ("unexpected key", _kick(queue="emails"), "unexpected key(s) queue"),
    ("chain on a kick", _kick(chain=1), "unexpected key(s) chain"),
    ("chain missing", {"pgdrain": {"reason": "continue", "queues": ["emails"]}}, "'chain' is null"),
    ("chain a string", _continue("2"), "'chain' is a string, not a whole number"),
    ("chain a bool", _continue(True), "'chain' is a boolean, not a whole number"),
    ("chain zero", _continue(0), "'chain' must be from 1 to 10000"),
    (
        "wake with a chain",
        {"pgdrain": {"reason": "wake", "queues": ["emails"], "chain": 1}},
        "unexpected key(s) chain",
    ),
    ("fanout without its run", _fanout(), "'run' must be a run id"),
    ("fanout run not an id", _fanout(run="x y"), "'run' must be a run id"),
    ("fanout run a number", _fanout(run=7), "'run' must be a run id"),
    ("fanout chain zero", _fanout(run="r", chain=0), "fanout event: 'chain' must be from 1"),
    ("later without a moment", _later(at=None), "'at' must be an ISO 8601 time"),
    ("later moment a number", _later(at=1764597900), "'at' must be an ISO 8601 time"),
    ("later moment not a time", _later(at="soon"), "'at' is not an ISO 8601 time: 'soon'"),
    ("later moment naive", _later(at="2026-12-01T14:05:00"), "'at' has no UTC offset"),
    ("later moment too long", _later(at="2" * 41), "'at' must be an ISO 8601 time"),
    (
        "later moment before year 1 in UTC",
        _later(at="0001-01-01T00:00:00+01:00"),
        "'at' is out of range in UTC",
    ),
    (
        "later moment after 9999 in UTC",
        _later(at="9999-12-31T23:59:00-01:00"),
        "'at' is out of range in UTC",
    ),
    ("later without its id", _later(reserved_by=None), "'reserved_by' must be a run id"),
    ("later with a chain", _later(chain=1), "unexpected key(s) chain"),
    ("oversized", {**RULE_EVENT, "detail": {"pad": "x" * 20_000}}, "bytes; the limit is 16384"),
    ("not plain json", {"pgdrain": {1, 2}}, "the event is not plain JSON"),
]


@pytest.mark.parametrize(
    ("event", "message"), [(e, m) for _, e, m in BAD], ids=[n for n, _, _ in BAD]
)
def test_anything_else_is_a_bad_event_in_one_line(event: Any, message: str) -> None:
    with pytest.raises(BadEvent) as raised:
        events.parse(event, SETTINGS)
    text = str(raised.value)
    assert message in text
    assert "\n" not in text and len(text) < 300


def test_the_correlation_id_is_the_event_id_when_there_is_one() -> None:
    assert events.correlation_id(RULE_EVENT) == RULE_EVENT["id"]
    assert events.correlation_id(events.enqueue_event(["emails"])) is None
    assert events.correlation_id({"id": "x" * 1000}) is None
    assert events.correlation_id("id") is None
