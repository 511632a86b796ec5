"""kick() where no function drains: a NOTIFY on pgdrain_kick that wakes `pgdrain worker`, and
how a kick that nobody hears is told apart from one a worker hears (api/kick_target.py). The
listener here stands in for a worker: a connection named as a worker's, LISTENing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.cli import run_pgdrain
from pgdrain import Settings, enqueue
from pgdrain.api import kick_target
from pgdrain.api.kick_target import AWS_VARIABLES, CHANNEL, LISTENER_APPLICATION_NAME
from pgdrain.aws.kick import kick
from pgdrain.db import store
from pgdrain.errors import BadInput, ConfigError

Conn = psycopg.Connection[Any]
MARKER = "marker"


@pytest.fixture(autouse=True)
def off_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a laptop: no AWS variable, no kick setting, and the warning not yet given."""
    for name in (*AWS_VARIABLES, "PGDRAIN_KICK", "PGDRAIN_FUNCTION_NAME"):
        monkeypatch.delenv(name, raising=False)
    kick_target._warned.clear()


@pytest.fixture
def listener(db_url: str) -> Iterator[Conn]:
    with psycopg.connect(
        db_url, autocommit=True, application_name=LISTENER_APPLICATION_NAME
    ) as conn:
        store.kick_listen(conn)
        yield conn


def received(listener: Conn, sender: Conn) -> list[str]:
    """The payloads the listener got up to now: a marker is sent last and read up to, so what
    the sender sent before it has arrived (notifications from one session keep their order)."""
    sender.execute("SELECT pg_notify(%s, %s)", (CHANNEL, MARKER))
    if not sender.autocommit:
        sender.commit()
    payloads: list[str] = []
    for notify in listener.notifies(timeout=10):
        if notify.payload == MARKER:
            return payloads
        payloads.append(notify.payload)
    raise AssertionError("the marker did not arrive")


def kick_rows(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgdrain.kicks").fetchone()
    assert row is not None
    return int(row[0])


def test_without_a_function_name_a_kick_notifies_the_workers(conn: Conn, listener: Conn) -> None:
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="sms")
    assert kick(conn, ["sms", "emails"], settings=Settings()) == ("emails", "sms")
    assert received(listener, conn) == ["emails,sms"]
    assert kick_rows(conn) == 0  # the function's debounce is not involved


def test_a_kick_on_a_connection_that_is_not_autocommit_is_delivered(
    db_url: str, conn: Conn, listener: Conn
) -> None:
    """A red team's report: the README's kick on `psycopg.connect(url)` (not autocommit) left
    its NOTIFY in a transaction that nothing committed; the worker never heard it."""
    app = psycopg.connect(db_url)  # as the README opens it
    try:
        with app.transaction():
            enqueue(app, "noop", {}, queue="emails")
        assert kick(app, ["emails"], settings=Settings()) == ("emails",)
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        app.close()  # no commit of its own
    assert received(listener, conn) == ["emails"]


def test_a_kick_that_no_worker_hears_says_so_once(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    assert kick(conn, ["emails"], settings=Settings()) == ()
    assert kick(conn, ["emails"], settings=Settings()) == ()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "no `pgdrain worker` is connected to this database" in warnings[0].getMessage()


@pytest.mark.parametrize("variable", AWS_VARIABLES)
def test_on_aws_a_kick_without_a_function_name_raises_and_sends_nothing(
    conn: Conn, listener: Conn, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "deployed")
    with pytest.raises(ConfigError, match="PGDRAIN_FUNCTION_NAME is not set, and this runs on"):
        kick(conn, ["emails"], settings=Settings())
    assert received(listener, conn) == []


def test_on_aws_a_worker_named_in_the_settings_is_kicked(
    conn: Conn, listener: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker in a container in production: PGDRAIN_KICK=worker says so."""
    monkeypatch.setenv("AWS_EXECUTION_ENV", "AWS_ECS_FARGATE")
    monkeypatch.setenv("PGDRAIN_KICK", "worker")
    assert kick(conn, "emails") == ("emails",)
    assert received(listener, conn) == ["emails"]


def test_a_worker_kick_inside_an_open_transaction_is_refused(db_url: str, listener: Conn) -> None:
    """As the function's kick is: code that kicks a worker works unchanged against Lambda."""
    with psycopg.connect(db_url) as app_conn:  # not autocommit: the enqueue's transaction
        enqueue(app_conn, "noop", {}, queue="emails")
        with pytest.raises(BadInput, match="after the enqueue commits"):
            kick(app_conn, ["emails"], settings=Settings())
        app_conn.commit()
        assert kick(app_conn, ["emails"], settings=Settings()) == ("emails",)
        assert received(listener, app_conn) == ["emails"]


@pytest.mark.parametrize("kick", ["", "off"], ids=["wakes-the-workers", "control-kicks-off"])
def test_an_operators_retry_wakes_the_workers_as_a_kick_does(
    db_url: str, conn: Conn, listener: Conn, kick: str
) -> None:
    """A red team's report: `pgdrain retry`, `cancel` (freeing a sequence) and `resume` kicked
    only a function; without one, a `pgdrain worker` found their jobs at its safety net."""
    job_id = enqueue(conn, "noop", queue="emails")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'failed', finished_at = now() WHERE id = %s", (job_id,)
    )
    env = {"DATABASE_URL": db_url, "PGDRAIN_KICK": kick} if kick else {"DATABASE_URL": db_url}
    done = run_pgdrain("retry", str(job_id), env=env, drop=("PGDRAIN_", *AWS_VARIABLES))
    assert done.code == 0, done.err
    assert done.out.splitlines() == [f"queued again: [{job_id}]"]  # it says nothing of the kick
    assert received(listener, conn) == ([] if kick else ["emails"])
