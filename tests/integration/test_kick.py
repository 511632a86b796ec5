"""pgdrain.kick(): the application's nudge after an enqueue commits. Debounced through the
database (one invocation per queue per window, however many callers), then an asynchronous
invoke of the drain function, here moto's, counted with a spy on the boto3 client."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    FUNCTION_NAME,
    InvokeSpy,
)
from pgdrain import Settings, enqueue
from pgdrain.aws import events
from pgdrain.aws.kick import kick
from pgdrain.aws.lambda_api import lambda_client
from pgdrain.errors import BadInput

Conn = psycopg.Connection[Any]

THREADS = 8
KICKS_PER_THREAD = 125  # 1,000 enqueue + kick calls in all
DEBOUNCE_SECONDS = 1.0


def _settings(**changes: Any) -> Settings:
    values: dict[str, Any] = {
        "function_name": FUNCTION_NAME,
        "kick_debounce_seconds": DEBOUNCE_SECONDS,
    }
    values.update(changes)
    return Settings(**values)


def _kick_rows(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgdrain.kicks").fetchone()
    assert row is not None
    return int(row[0])


def test_a_burst_of_enqueues_becomes_at_most_one_invocation_per_window(
    db_url: str, conn: Conn, lambda_api: Any, spy: InvokeSpy
) -> None:
    settings = _settings()
    start = threading.Barrier(THREADS)
    invoked: list[tuple[str, ...]] = []
    errors: list[BaseException] = []

    def application() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as own:
                start.wait()
                for i in range(KICKS_PER_THREAD):
                    with own.transaction():
                        enqueue(own, "noop", {"i": i}, queue="emails")
                    invoked.append(kick(own, ["emails"], settings=settings, client=lambda_api))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=application) for _ in range(THREADS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began

    assert errors == []
    row = conn.execute("SELECT count(*) FROM pgdrain.jobs WHERE queue = 'emails'").fetchone()
    assert row is not None and row[0] == THREADS * KICKS_PER_THREAD
    invocations = len(spy.calls)
    assert 1 <= invocations <= elapsed / DEBOUNCE_SECONDS + 1, (invocations, elapsed)
    assert sum(1 for queues in invoked if queues) == invocations
    assert all(call["InvocationType"] == "Event" for call in spy.calls)
    assert spy.events() == [events.enqueue_event(["emails"])] * invocations


def test_the_window_is_per_queue(conn: Conn, lambda_api: Any, spy: InvokeSpy) -> None:
    settings = _settings(kick_debounce_seconds=3600)
    assert kick(conn, ["alpha"], settings=settings, client=lambda_api) == ("alpha",)
    assert kick(conn, ["alpha", "beta"], settings=settings, client=lambda_api) == ("beta",)
    assert kick(conn, ["beta", "alpha"], settings=settings, client=lambda_api) == ()
    assert spy.events() == [events.enqueue_event(["alpha"]), events.enqueue_event(["beta"])]


def test_the_event_kicked_is_one_the_function_accepts(
    conn: Conn, lambda_api: Any, spy: InvokeSpy
) -> None:
    kick(conn, ["emails", "sms"], settings=_settings(), client=lambda_api)
    (event,) = spy.events()
    assert event == events.enqueue_event(["emails", "sms"])
    trigger = events.parse(event, Settings(queues=("emails", "sms", "default")))
    assert (trigger.reason, trigger.queues) == ("enqueue", ("emails", "sms", "default"))


def test_with_kicks_off_a_kick_is_skipped(conn: Conn, caplog: pytest.LogCaptureFixture) -> None:
    # Without a function name, kick() wakes a worker instead: test_kick_worker.py.
    caplog.set_level(logging.DEBUG, logger="pgdrain.aws.kick")
    assert kick(conn, ["emails"], settings=Settings(kick="off")) == ()
    assert [r.getMessage() for r in caplog.records] == ["kick skipped: PGDRAIN_KICK=off"]
    assert _kick_rows(conn) == 0  # nothing written either


def test_the_settings_come_from_the_environment(
    conn: Conn, lambda_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGDRAIN_FUNCTION_NAME", FUNCTION_NAME)
    monkeypatch.setenv("PGDRAIN_KICK_DEBOUNCE_SECONDS", "3600")
    recorder = InvokeSpy()
    recorder.attach(lambda_client())  # the client kick() makes for itself
    assert kick(conn, "emails") == ("emails",)  # one name, not a list of letters
    assert kick(conn, "emails") == ()
    assert recorder.events() == [events.enqueue_event(["emails"])]
    assert recorder.calls[0]["FunctionName"] == FUNCTION_NAME


def test_a_kick_inside_an_open_transaction_is_refused(
    db_url: str, lambda_api: Any, spy: InvokeSpy
) -> None:
    with psycopg.connect(db_url) as app_conn:  # not autocommit: the enqueue's transaction
        enqueue(app_conn, "noop", {}, queue="emails")
        with pytest.raises(BadInput, match="after the enqueue commits"):
            kick(app_conn, ["emails"], settings=_settings(), client=lambda_api)
        app_conn.commit()
        assert kick(app_conn, ["emails"], settings=_settings(), client=lambda_api) == ("emails",)
    assert len(spy.calls) == 1


def test_a_kick_on_a_closed_connection_says_it_is_closed(db_url: str, spy: InvokeSpy) -> None:
    """A red team's report: it said the connection had a transaction open."""
    closed = psycopg.connect(db_url, autocommit=True)
    closed.close()
    with pytest.raises(BadInput, match="the connection is closed"):
        kick(closed, ["emails"], settings=_settings())
    assert spy.calls == []


def test_a_kick_for_a_queue_the_function_does_not_drain_raises_at_once(
    conn: Conn, lambda_api: Any, spy: InvokeSpy
) -> None:
    """PGDRAIN_QUEUES restricts the function: the job of a queue outside it would wait for
    an alarm. The application hears of it at the kick, and nothing is invoked or recorded;
    without the restriction (the default: every queue) the same kick invokes."""
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    restricted = _settings(queues=("default",))
    with pytest.raises(
        BadInput, match=r"queue 'emails' is not drained by this function \(PGDRAIN_QUEUES=default\)"
    ):
        kick(conn, ["emails"], settings=restricted, client=lambda_api)
    assert (spy.calls, _kick_rows(conn)) == ([], 0)
    assert kick(conn, ["emails"], settings=_settings(), client=lambda_api) == ("emails",)
    assert len(spy.calls) == 1


@pytest.mark.parametrize(
    "queues",
    [[], ["bad name!"], [7], None, 7],
    ids=["none", "not-an-identifier", "not-a-string", "None", "not-a-list"],
)
def test_bad_queue_names_are_refused(conn: Conn, queues: Any) -> None:
    with pytest.raises(BadInput):
        kick(conn, queues, settings=_settings())
    assert _kick_rows(conn) == 0


@pytest.mark.parametrize("cleared", [True, False], ids=["cleared", "control-not-cleared"])
def test_a_failed_invoke_is_logged_not_raised_and_suppresses_nothing(
    conn: Conn, lambda_api: Any, spy: InvokeSpy, caplog: pytest.LogCaptureFixture, cleared: bool
) -> None:
    from botocore.stub import Stubber

    settings = _settings(kick_debounce_seconds=3600)
    with Stubber(lambda_api) as stubber:  # moto accepts any function name: stub the refusal
        stubber.add_client_error(
            "invoke", service_error_code="ResourceNotFoundException", http_status_code=404
        )
        assert kick(conn, ["emails"], settings=settings, client=lambda_api) == ()
        stubber.assert_no_pending_responses()
    (record,) = [r for r in caplog.records if r.name == "pgdrain.aws.kick"]
    assert record.levelno == logging.WARNING
    assert "the next kick invokes again" in record.getMessage()
    assert "ResourceNotFoundException" in record.__dict__["error"]
    if not cleared:  # the control: the failed invoke's debounce left in place, as before
        conn.execute("UPDATE pgdrain.kicks SET kicked_at = now()")

    # The next kick, well inside the window: invoked, unless the failure still suppresses it.
    again = kick(conn, ["emails"], settings=settings, client=lambda_api)
    assert again == (("emails",) if cleared else ())
    assert len(spy.calls) == (2 if cleared else 1)  # the spy saw the refused invoke too


def test_an_application_without_boto3_is_told_what_to_install_and_the_kick_is_cleared(
    conn: Conn,
    lambda_api: Any,
    spy: InvokeSpy,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A red team's report: without the [aws] extra, kick() raised ModuleNotFoundError after
    the enqueue committed, and its debounce, already written, held the next kick back."""
    settings = _settings(kick_debounce_seconds=3600)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "botocore.exceptions", None)  # as if not installed
        assert kick(conn, ["emails"], settings=settings, client=lambda_api) == ()
    (record,) = [r for r in caplog.records if r.name == "pgdrain.aws.kick"]
    assert "install pgdrain[aws] to kick the function" in record.__dict__["error"]
    assert kick(conn, ["emails"], settings=settings, client=lambda_api) == ("emails",)
    assert len(spy.calls) == 1
