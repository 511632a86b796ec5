"""build_job: every field is checked before anything reaches the database, and a bad one is
refused with BadInput and a one-line reason (no database)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from pgdrain.api.enqueue import MAX_PAYLOAD_BYTES, build_job
from pgdrain.db.store import NewJob
from pgdrain.errors import BadInput

UTC = dt.UTC


def test_a_good_job_keeps_every_field() -> None:
    run_at = dt.datetime(2030, 1, 1, tzinfo=UTC)
    job = build_job(
        "send_email",
        {"email_id": 7},
        queue_name="emails",
        run_at=run_at,
        priority=-3,
        max_attempts=2,
        recovery_policy="manual",
        idempotency_key="order-42",
    )
    assert job == NewJob(
        kind="send_email",
        payload={"email_id": 7},
        queue="emails",
        priority=-3,
        run_at=run_at,
        delay_seconds=0.0,
        max_attempts=2,
        recovery_policy="manual",
        idempotency_key="order-42",
    )


def test_defaults() -> None:
    job = build_job("send_email")
    assert (job.queue, job.priority, job.max_attempts, job.recovery_policy) == (
        "default",
        0,
        5,
        "auto",
    )
    assert (job.payload, job.run_at, job.delay_seconds, job.idempotency_key) == (
        None,
        None,
        0.0,
        None,
    )


def test_an_int_delay_becomes_seconds() -> None:
    assert build_job("k", delay=30).delay_seconds == 30.0


def _payload_of_exactly(size: int) -> dict[str, str]:
    """A payload whose JSON (as sent) is exactly `size` bytes."""
    overhead = len(json.dumps({"b": ""}))
    return {"b": "x" * (size - overhead)}


def test_a_payload_at_the_limit_is_accepted() -> None:
    payload = _payload_of_exactly(MAX_PAYLOAD_BYTES)
    assert len(json.dumps(payload).encode()) == MAX_PAYLOAD_BYTES
    assert build_job("k", payload).payload == payload


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("empty kind", {"kind": ""}, "kind"),
    ("blank kind", {"kind": "  \t"}, "kind"),
    ("kind not a string", {"kind": 42}, "kind"),
    ("kind None", {"kind": None}, "kind"),
    ("kind too long", {"kind": "k" * 201}, "kind"),
    ("kind with NUL", {"kind": "send\x00email"}, "NUL"),
    ("kind with a lone surrogate", {"kind": "send\udcffemail"}, "UTF-8"),
    ("kind with a tab", {"kind": "send\temail"}, "printable"),
    ("kind with a newline", {"kind": "send\nemail"}, "printable"),
    ("kind with ESC", {"kind": "\x1b[2Jsend"}, "printable"),
    ("kind with a right-to-left override", {"kind": "\u202eliame_dnes"}, "printable"),
    ("queue empty", {"queue_name": ""}, "queue"),
    ("queue with a quote", {"queue_name": "q'; DROP TABLE pgdrain.jobs; --"}, "queue"),
    ("queue with a space", {"queue_name": "my queue"}, "queue"),
    ("queue with a final newline", {"queue_name": "emails\n"}, "queue"),
    ("queue too long", {"queue_name": "q" * 64}, "queue"),
    ("queue not a string", {"queue_name": 7}, "queue"),
    ("negative delay", {"delay": -1}, "delay"),
    ("NaN delay", {"delay": float("nan")}, "delay"),
    ("infinite delay", {"delay": float("inf")}, "delay"),
    ("delay past any timestamp", {"delay": 1e300}, "delay"),
    ("delay as text", {"delay": "5"}, "delay"),
    ("delay as bool", {"delay": True}, "delay"),
    ("naive run_at", {"run_at": dt.datetime(2030, 1, 1)}, "run_at"),
    ("run_at as text", {"run_at": "2030-01-01T00:00:00Z"}, "run_at"),
    ("run_at a date", {"run_at": dt.date(2030, 1, 1)}, "run_at"),
    ("delay past any float", {"delay": 10**400}, "delay"),
    ("run_at and delay", {"run_at": dt.datetime(2030, 1, 1, tzinfo=UTC), "delay": 5}, "run_at"),
    ("priority as float", {"priority": 1.5}, "priority"),
    ("priority as bool", {"priority": False}, "priority"),
    ("priority over int32", {"priority": 2**31}, "priority"),
    ("priority under int32", {"priority": -(2**31)}, "priority"),
    ("max_attempts 0", {"max_attempts": 0}, "max_attempts"),
    ("max_attempts negative", {"max_attempts": -1}, "max_attempts"),
    ("max_attempts huge", {"max_attempts": 1001}, "max_attempts"),
    ("max_attempts as text", {"max_attempts": "3"}, "max_attempts"),
    ("max_attempts as bool", {"max_attempts": True}, "max_attempts"),
    ("unknown recovery_policy", {"recovery_policy": "never"}, "recovery_policy"),
    ("empty key", {"idempotency_key": ""}, "idempotency key"),
    ("key too long", {"idempotency_key": "k" * 501}, "idempotency key"),
    ("key with NUL", {"idempotency_key": "a\x00b"}, "idempotency key"),
    ("key not a string", {"idempotency_key": 42}, "idempotency key"),
    ("payload a set", {"payload": {1, 2}}, "JSON"),
    ("payload an object", {"payload": {"when": dt.datetime(2030, 1, 1)}}, "JSON"),
    ("payload NaN", {"payload": {"x": float("nan")}}, "JSON"),
    ("payload infinite", {"payload": [float("inf")]}, "JSON"),
    ("payload one byte over", {"payload": _payload_of_exactly(MAX_PAYLOAD_BYTES + 1)}, "limit"),
    ("payload with NUL", {"payload": {"a": "x\x00y"}}, "NUL"),
    ("payload key with NUL", {"payload": {"a\x00": 1}}, "NUL"),
    ("payload with a lone surrogate", {"payload": {"a": "\ud800"}}, "UTF-8"),
    ("payload key with a lone surrogate", {"payload": {"\udcff": 1}}, "UTF-8"),
]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [pytest.param(fields, problem, id=what) for what, fields, problem in BAD],
)
def test_bad_input_is_refused_with_one_line(fields: dict[str, Any], problem: str) -> None:
    arguments: dict[str, Any] = {"kind": "send_email", **fields}
    kind = arguments.pop("kind")
    with pytest.raises(BadInput) as refused:
        build_job(kind, **arguments)
    message = str(refused.value)
    assert problem in message
    assert "\n" not in message
    assert "\x00" not in message


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"kind": "k" * 200}, id="kind of 200"),
        pytest.param({"kind": "メール送信"}, id="non-ASCII kind"),
        pytest.param({"queue_name": "q" * 63}, id="queue of 63"),
        pytest.param({"delay": 0.0}, id="delay 0"),
        pytest.param({"priority": 2**31 - 1}, id="priority int32 max"),
        pytest.param({"max_attempts": 1}, id="max_attempts 1"),
        pytest.param({"max_attempts": 1000}, id="max_attempts 1000"),
        pytest.param({"idempotency_key": "k" * 500}, id="key of 500"),
        pytest.param({"payload": {"emoji": "\U0001f600", "text": "こんにちは"}}, id="unicode"),
        pytest.param({"payload": [1, "two", None, True, {"n": 1.5}]}, id="any JSON"),
        # the six characters \u0000 (a backslash, then u0000): no NUL, which jsonb stores
        pytest.param({"payload": {"path": "C:\\u0000x"}}, id="text that reads like NUL"),
    ],
)
def test_control_good_values_at_the_edges_pass(fields: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"kind": "send_email", **fields}
    kind = arguments.pop("kind")
    assert isinstance(build_job(kind, **arguments), NewJob)
