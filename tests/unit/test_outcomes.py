"""outcomes.decide and the error texts, without a database: what each raised exception
becomes, and texts made storable and bounded whatever the job raised."""

from __future__ import annotations

import pytest

from pgdrain import Cancel, Discard, RetryIn, Snooze
from pgdrain.api import outcomes
from pgdrain.errors import UnknownJobKind


def _backoff(attempt: int) -> float:
    return 7.0 * attempt


@pytest.mark.parametrize(
    ("error", "delay", "final", "spend", "record", "message"),
    [
        (ValueError("x"), 14.0, False, True, True, "ValueError: x"),
        (RetryIn(30, "later"), 30.0, False, True, True, "RetryIn: later"),
        (Snooze(60), 60.0, False, False, False, "Snooze: snoozed for 60 s"),
        (Discard("bad"), 0.0, True, True, True, "discarded: bad"),
        (Cancel("stop"), 0.0, True, True, True, "cancelled: stop"),
        # Raised by a job's own code (a typo'd kind it enqueues): a failure like any other.
        (
            UnknownJobKind("no function is registered for job kind 'k'"),
            14.0,
            False,
            True,
            True,
            "UnknownJobKind: no function is registered for job kind 'k'",
        ),
    ],
)
def test_what_each_exception_becomes(
    error: BaseException, delay: float, final: bool, spend: bool, record: bool, message: str
) -> None:
    decision = outcomes.decide(error, 2, _backoff)
    assert (decision.delay_seconds, decision.final, decision.spend_attempt) == (delay, final, spend)
    assert (decision.record, decision.message) == (record, message)


def test_a_kind_the_run_does_not_know_is_retried_as_deploy_lag() -> None:
    """Only the run's lookup of the claimed job's kind (runner/execute.py): default backoff."""
    decision = outcomes.decide_unregistered(UnknownJobKind("no function for 'k'"), 1)
    assert decision.message == (
        "UnknownJobKind: no function for 'k' in this deployment (a deploy may not have "
        "reached every function yet, or the queue is another deployment's: see PGDRAIN_QUEUES)"
    )
    assert not decision.final and decision.spend_attempt and decision.delay_seconds > 0


class RateLimited(RetryIn):
    """As an application may write one: its delay from a Retry-After header, set directly."""

    def __init__(self, retry_after: object) -> None:
        Exception.__init__(self, "rate limited")
        self.seconds = retry_after  # type: ignore[assignment]


@pytest.mark.parametrize(
    "seconds",
    [float("nan"), 1e300, 10**400, None, "120", -5],
    ids=["nan", "1e300", "10**400", "none", "text", "-5"],
)
def test_a_delay_no_statement_can_store_is_retried_with_backoff(seconds: object) -> None:
    """A red team's report: the statement recording it failed, and the run with it."""
    decision = outcomes.decide(RateLimited(seconds), 2, _backoff)
    assert (decision.delay_seconds, decision.final, decision.spend_attempt) == (14.0, False, True)
    assert decision.message.startswith("RateLimited: rate limited (RetryIn needs ")


class BrokenDelay(RetryIn):
    """A subclass whose `seconds` is a property that raises."""

    def __init__(self) -> None:
        Exception.__init__(self, "no delay")

    @property
    def seconds(self) -> float:  # type: ignore[override]
        raise OverflowError("the header's delay is out of range")


def test_a_delay_that_raises_when_read_is_retried_with_backoff() -> None:
    decision = outcomes.decide(BrokenDelay(), 2, _backoff)
    assert (decision.delay_seconds, decision.final, decision.spend_attempt) == (14.0, False, True)
    assert decision.message == (
        "BrokenDelay: no delay (the header's delay is out of range: retried with backoff)"
    )


def test_control_a_subclass_with_a_storable_delay_keeps_it() -> None:
    decision = outcomes.decide(RateLimited(120), 2, _backoff)
    assert (decision.delay_seconds, decision.message) == (120.0, "RateLimited: rate limited")


def test_only_an_ordinary_error_keeps_a_traceback() -> None:
    try:
        raise ValueError("with a traceback")
    except ValueError as exc:
        decision = outcomes.decide(exc, 1, _backoff)
    assert decision.traceback.startswith("Traceback (most recent call last)")
    assert outcomes.decide(Discard("x"), 1, _backoff).traceback == ""


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("a\x00b", "a\\x00b"),
        ("bad \udc80 byte", "bad \\udc80 byte"),
        ("fine: é ✓", "fine: é ✓"),
    ],
)
def test_texts_are_made_storable(text: str, stored: str) -> None:
    assert outcomes.sanitize(text) == stored
    stored.encode("utf-8")  # no lone surrogate left


def test_a_str_that_raises_or_returns_no_text_falls_back_to_the_type() -> None:
    class Raises(Exception):
        def __str__(self) -> str:
            raise KeyError("no")

    class NotText(Exception):
        def __str__(self) -> str:
            return 42  # type: ignore[return-value]

    assert outcomes.error_text(Raises()) == "Raises: <str() raised KeyError>"
    assert outcomes.error_text(NotText()) == "NotText: <str() raised TypeError>"
    assert outcomes.error_text(ValueError()) == "ValueError"


def test_texts_are_bounded_and_a_traceback_keeps_its_end() -> None:
    assert len(outcomes.error_text(ValueError("x" * 10_000))) == outcomes.MAX_ERROR_LENGTH

    try:
        raise ValueError("y" * 9000 + " THE END")
    except ValueError as exc:
        text = outcomes.traceback_text(exc)
    assert len(text) == outcomes.MAX_TRACEBACK_LENGTH
    assert text.startswith("…") and text.endswith(" THE END\n")  # where it was raised
