"""The Lambda handler (handler/app.py) against a real PostgreSQL, with AWS from moto: which
queues each event drains, what a bad event does (nothing, and says why), credentials from
Secrets Manager, the continuation when time runs out, and the metrics it prints."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psycopg
import pytest

from helpers.aws import (
    FUNCTION_ARN,
    METRIC_NAMES,
    REGION,
    FakeContext,
    InvokeSpy,
    aws_environment,
    create_function,
    emf_records,
    log_records,
    metric_totals,
    mocked_aws,
)
from helpers.fixtures import claim_batch, wait_for
from helpers.protocol import traced_connections
from pgdrain import enqueue, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.aws import run as lambda_run
from pgdrain.aws.lambda_api import lambda_client
from pgdrain.aws.metrics import ProgressMetrics
from pgdrain.db import retention, store
from pgdrain.settings import ENV_VARIABLES

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

Conn = psycopg.Connection[Any]
ROOT = Path(__file__).resolve().parents[2]

SCHEDULED_EVENT = {
    "version": "0",
    "id": "cdc73f9d-aea9-11e3-9d5a-835b769c0d9c",
    "detail-type": "Scheduled Event",
    "source": "aws.events",
    "account": "123456789012",
    "time": "2026-01-01T00:00:00Z",
    "region": "us-east-1",
    "resources": ["arn:aws:events:us-east-1:123456789012:rule/pgdrain"],
    "detail": {},
}
SCHEDULER_EVENT = json.loads((ROOT / "infra" / "events" / "schedule.json").read_text())


class Function:
    """The handler module as Lambda runs it: settings read at cold start from the environment,
    then one call per event with a context whose time runs out."""

    def __init__(self, db_url: str, monkeypatch: pytest.MonkeyPatch, logs: io.StringIO) -> None:
        self.db_url = db_url
        self.monkeypatch = monkeypatch
        self.logs = logs
        for name in ENV_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        self.configure(DATABASE_URL=db_url)

    def configure(self, **env: str) -> None:
        """Set variables and start cold, as a new deployment would."""
        import app

        for name, value in env.items():
            self.monkeypatch.setenv(name, value)
        self.monkeypatch.setattr(app, "runtime", lambda_run.cold_start(os.environ))

    def invoke(self, event: Any, remaining_s: float = 60.0, arn: str = FUNCTION_ARN) -> Any:
        import app

        context = cast("LambdaContext", FakeContext(remaining_s, arn))  # what the handler reads
        return app.lambda_handler(event, context)

    def log_lines(self) -> list[dict[str, Any]]:
        return log_records(self.logs.getvalue())


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """The function's log output (the Powertools handler's stream), captured for the test.
    Afterwards the `pgdrain` logger is as it was before the handler module configured it, so
    the tests that follow see the library's plain logging."""
    library = logging.getLogger("pgdrain")
    level = library.level
    import app

    handler = app.logger.logger_handler
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    if handler not in library.handlers:
        library.addHandler(handler)
    library.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        handler.setStream(previous)
        library.removeHandler(handler)
        library.setLevel(level)


@pytest.fixture
def function(db_url: str, monkeypatch: pytest.MonkeyPatch, logs: io.StringIO) -> Iterator[Function]:
    aws_environment(monkeypatch)
    with mocked_aws():
        yield Function(db_url, monkeypatch, logs)


def _enqueue(conn: Conn, queue_name: str, count: int, kind: str = "noop", **payload: Any) -> None:
    with conn.transaction():
        for _ in range(count):
            enqueue(conn, kind, payload, queue=queue_name)


def _statuses(conn: Conn) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT queue, status, count(*) FROM pgdrain.jobs GROUP BY queue, status"
    ).fetchall()
    return {(r[0], r[1]): int(r[2]) for r in rows}


# -- which queues each event drains -----------------------------------------------------------


@pytest.mark.parametrize("event", [SCHEDULED_EVENT, SCHEDULER_EVENT], ids=["rule", "scheduler"])
def test_a_scheduled_event_drains_every_configured_queue(
    function: Function, conn: Conn, event: dict[str, Any]
) -> None:
    function.configure(PGDRAIN_QUEUES="alpha,beta")
    _enqueue(conn, "alpha", 5)
    _enqueue(conn, "beta", 4)
    _enqueue(conn, "gamma", 3)  # not this function's queue

    result = function.invoke(event)

    assert result["ok"] is True, result
    assert (result["trigger"], result["queues"]) == ("schedule", ["alpha", "beta"])
    assert result["result"]["done"] == 9
    assert _statuses(conn) == {("alpha", "done"): 5, ("beta", "done"): 4, ("gamma", "queued"): 3}
    assert {line["correlation_id"] for line in function.log_lines()} == {event["id"]}
    # What the restriction leaves is said, not silent.
    assert result["result"]["unserved"] == {"gamma": 3}


def test_without_pgdrain_queues_every_event_drains_every_queue(
    function: Function, conn: Conn
) -> None:
    """The default: a job enqueued in any queue is run, whichever queue the kick names (the
    first day's trap: a kind declared with queue="emails" waited for an alarm)."""
    _enqueue(conn, "default", 2)
    _enqueue(conn, "emails", 3)

    kicked = function.invoke({"pgdrain": {"reason": "enqueue", "queues": ["emails"]}})

    assert kicked["ok"] is True, kicked
    assert (kicked["queues"], kicked["result"]["done"], kicked["result"]["unserved"]) == (
        None,
        5,
        {},
    )
    _enqueue(conn, "reports", 1)
    scheduled = function.invoke(SCHEDULED_EVENT)
    assert (scheduled["queues"], scheduled["result"]["done"]) == (None, 1)
    assert _statuses(conn) == {
        ("default", "done"): 2,
        ("emails", "done"): 3,
        ("reports", "done"): 1,
    }


def test_a_kick_for_a_queue_outside_pgdrain_queues_is_an_error_in_the_log_and_still_drains(
    function: Function, conn: Conn
) -> None:
    """Loud (an error line naming the queue, its ready jobs in the summary), and right: the
    queues the function does drain are not left waiting for it."""
    function.configure(PGDRAIN_QUEUES="alpha")
    _enqueue(conn, "alpha", 2)
    _enqueue(conn, "gamma", 1)

    result = function.invoke({"pgdrain": {"reason": "enqueue", "queues": ["alpha", "gamma"]}})

    assert result["ok"] is True, result
    assert (result["result"]["done"], result["result"]["unserved"]) == (2, {"gamma": 1})
    errors = [line for line in function.log_lines() if line["level"] == "ERROR"]
    assert len(errors) == 1, errors
    assert "does not drain (PGDRAIN_QUEUES=alpha)" in errors[0]["message"]
    assert errors[0]["unserved"] == ["gamma"]


def test_an_enqueue_event_drains_every_queue_of_the_function(
    function: Function, conn: Conn
) -> None:
    """A kick for beta starts a run that drains alpha too (the runs are interchangeable, so a
    cap on runs serves every queue), and nothing outside PGDRAIN_QUEUES."""
    function.configure(PGDRAIN_QUEUES="alpha,beta")
    _enqueue(conn, "alpha", 5)
    _enqueue(conn, "beta", 4)
    _enqueue(conn, "gamma", 3)

    result = function.invoke({"pgdrain": {"reason": "enqueue", "queues": ["beta"]}})

    assert result["ok"] is True, result
    assert (result["trigger"], result["queues"], result["result"]["done"]) == (
        "enqueue",
        ["alpha", "beta"],
        9,
    )
    assert _statuses(conn) == {("alpha", "done"): 5, ("beta", "done"): 4, ("gamma", "queued"): 3}


# -- bad events: an error, one log line, and no database connection ---------------------------

MALFORMED = {
    "a string": "drain please",
    "a list": [{"pgdrain": {"reason": "enqueue", "queues": ["default"]}}],
    "null": None,
    "empty": {},
    "unknown shape": {"Records": [{"body": "hello"}]},
    "body not an object": {"pgdrain": "enqueue"},
    "unknown reason": {"pgdrain": {"reason": "explode", "queues": ["default"]}},
    "queues not a list": {"pgdrain": {"reason": "enqueue", "queues": "default"}},
    "empty queues": {"pgdrain": {"reason": "enqueue", "queues": []}},
    "queue not a string": {"pgdrain": {"reason": "enqueue", "queues": [7]}},
    "queue not an identifier": {
        "pgdrain": {"reason": "enqueue", "queues": ["x'; DROP TABLE t;--"]}
    },
    "chain not a number": {"pgdrain": {"reason": "continue", "queues": ["default"], "chain": "2"}},
    "chain missing": {"pgdrain": {"reason": "continue", "queues": ["default"]}},
    "unexpected key": {"pgdrain": {"reason": "enqueue", "queues": ["default"], "queue": "x"}},
    "schedule detail not an object": {**SCHEDULED_EVENT, "detail": [1]},
    "oversized": {**SCHEDULED_EVENT, "detail": {"padding": "x" * 20_000}},
}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port that counts connection attempts: the 'database' for the bad-event tests."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        yield server
    finally:
        server.close()


def _attempts(server: socket.socket) -> int:
    count = 0
    while True:
        try:
            peer, _ = server.accept()
        except BlockingIOError:
            return count
        peer.close()
        count += 1


def _pgdrain_sessions(conn: Conn, db_url: str) -> int:
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgdrain' AND datname = %s",
        (dbname,),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("event", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_event_returns_an_error_and_opens_no_connection(
    function: Function, conn: Conn, db_url: str, listener: socket.socket, event: Any
) -> None:
    port = listener.getsockname()[1]
    function.configure(DATABASE_URL=f"postgresql://pgdrain@127.0.0.1:{port}/nowhere")
    _enqueue(conn, "default", 2)

    result = function.invoke(event)

    assert result["ok"] is False
    assert isinstance(result["error"], str) and result["error"]
    assert "\n" not in result["error"]
    errors = [line for line in function.log_lines() if line["level"] == "ERROR"]
    assert [line["message"] for line in errors] == [f"bad event: {result['error']}"]
    assert _attempts(listener) == 0, "the handler tried to connect for a bad event"
    assert _pgdrain_sessions(conn, db_url) == 0
    assert _statuses(conn) == {("default", "queued"): 2}


def test_the_bad_event_control_the_listener_sees_a_connection_attempt(
    function: Function, listener: socket.socket
) -> None:
    """Control for the test above: a good event does try the listener, so zero means zero."""
    port = listener.getsockname()[1]
    function.configure(
        DATABASE_URL=f"postgresql://pgdrain@127.0.0.1:{port}/nowhere", PGDRAIN_CONNECT_TIMEOUT="2"
    )
    result = function.invoke(SCHEDULED_EVENT, remaining_s=4.0)
    assert result["ok"] is False
    assert _attempts(listener) >= 1


def test_a_bad_setting_is_reported_by_every_invocation(function: Function, conn: Conn) -> None:
    function.configure(PGDRAIN_BATCH_SIZE="lots")
    result = function.invoke(SCHEDULED_EVENT)
    assert result == {
        "ok": False,
        "error": "PGDRAIN_BATCH_SIZE='lots' is not a whole number",
        "error_kind": "configuration",
    }


# -- credentials from Secrets Manager ---------------------------------------------------------

SECRET_PASSWORD = "Xq7-s3cr3t-Pa55w0rd-never-logged"


def _secret_for(db_url: str, **changes: Any) -> dict[str, Any]:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    secret = {
        "engine": "postgres",
        "host": params.get("host") or "localhost",
        "port": int(params.get("port") or 5432),
        "username": params.get("user") or "postgres",
        # The test servers trust local connections; a real password is used when the URL has one.
        "password": params.get("password") or SECRET_PASSWORD,
        "dbname": params["dbname"],
    }
    secret.update(changes)
    return secret


def _create_secret(value: dict[str, Any]) -> str:
    import boto3

    client = boto3.client("secretsmanager", region_name=REGION)
    return str(client.create_secret(Name="pgdrain/db", SecretString=json.dumps(value))["ARN"])


def _everything_printed(
    function: Function, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> str:
    captured = capsys.readouterr()
    records = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    return "\n".join([function.logs.getvalue(), captured.out, captured.err, caplog.text, records])


def test_credentials_from_a_secret_connect(
    function: Function,
    conn: Conn,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = _secret_for(db_url)
    arn = _create_secret(secret)
    function.configure(DATABASE_URL="", PGDRAIN_DB_SECRET_ARN=arn)
    _enqueue(conn, "default", 3)

    result = function.invoke(SCHEDULED_EVENT)

    assert result["ok"] is True, result
    assert result["result"]["done"] == 3
    assert secret["password"] not in json.dumps(result)
    assert secret["password"] not in _everything_printed(function, capsys, caplog)


def test_a_wrong_secret_gives_a_clear_error_without_the_password(
    function: Function,
    conn: Conn,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = _secret_for(db_url, username="no_such_role", password=SECRET_PASSWORD)
    function.configure(DATABASE_URL="", PGDRAIN_DB_SECRET_ARN=_create_secret(secret))
    _enqueue(conn, "default", 1)

    result = function.invoke(SCHEDULED_EVENT, remaining_s=10.0)

    assert result["ok"] is False
    assert result["error"].startswith("database refused the credentials:"), result["error"]
    assert "no_such_role" in result["error"]
    assert SECRET_PASSWORD not in json.dumps(result)
    assert SECRET_PASSWORD not in _everything_printed(function, capsys, caplog)
    assert _statuses(conn) == {("default", "queued"): 1}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "could not read the secret: An error occurred (ResourceNotFoundException)"),
        ("not json", "the secret is not JSON"),
        ({"host": "db", "username": "u", "password": SECRET_PASSWORD, "port": "five"}, "'port'"),
        ({"host": "db", "password": SECRET_PASSWORD}, "the secret has no 'username'"),
    ],
    ids=["missing", "not-json", "bad-port", "no-username"],
)
def test_an_unusable_secret_is_named_in_one_line(
    function: Function,
    value: Any,
    expected: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    import boto3

    arn = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:pgdrain/missing-AbCdEf"
    if value is not None:
        client = boto3.client("secretsmanager", region_name=REGION)
        text = value if isinstance(value, str) else json.dumps(value)
        arn = client.create_secret(Name="pgdrain/odd", SecretString=text)["ARN"]
    function.configure(DATABASE_URL="", PGDRAIN_DB_SECRET_ARN=arn)

    result = function.invoke(SCHEDULED_EVENT)

    assert result["ok"] is False
    assert expected in result["error"]
    # Secrets Manager's refusals (not found, access denied, throttled) are told apart by
    # their text only: unavailable; a secret that cannot work is a configuration error.
    assert result["error_kind"] == ("unavailable" if value is None else "configuration")
    assert "\n" not in result["error"]
    assert SECRET_PASSWORD not in _everything_printed(function, capsys, caplog)


def test_no_database_configured_is_a_configuration_error(function: Function) -> None:
    function.configure(DATABASE_URL="", PGDRAIN_DB_SECRET_ARN="")

    result = function.invoke(SCHEDULED_EVENT)

    assert result["ok"] is False
    assert result["error"].startswith("no database configured")
    assert result["error_kind"] == "configuration"


def test_a_rotated_secret_is_read_again_when_the_database_refuses_the_cached_one(
    function: Function, conn: Conn, db_url: str
) -> None:
    import boto3

    arn = _create_secret(_secret_for(db_url, username="before_rotation"))
    function.configure(DATABASE_URL="", PGDRAIN_DB_SECRET_ARN=arn)
    first = function.invoke(SCHEDULED_EVENT, remaining_s=10.0)  # caches the old credentials
    assert first["ok"] is False

    boto3.client("secretsmanager", region_name=REGION).put_secret_value(
        SecretId=arn, SecretString=json.dumps(_secret_for(db_url))
    )
    _enqueue(conn, "default", 2)
    second = function.invoke(SCHEDULED_EVENT)  # within the cache's max_age

    assert second["ok"] is True, second
    assert second["result"]["done"] == 2


# -- continuation -----------------------------------------------------------------------------


@pytest.fixture
def spy(function: Function) -> InvokeSpy:
    """The function's invokes of itself, seen on pgdrain's own Lambda client."""
    create_function()
    recorder = InvokeSpy()
    recorder.attach(lambda_client(REGION))
    return recorder


def test_a_run_out_of_time_with_work_left_continues_itself_once(
    function: Function, conn: Conn, spy: InvokeSpy, capsys: pytest.CaptureFixture[str]
) -> None:
    # One run at most: this test is about the continuation, not fan-out.
    function.configure(PGDRAIN_RESERVE_SECONDS="4.5", PGDRAIN_CONCURRENCY="2", PGDRAIN_MAX_RUNS="1")
    _enqueue(conn, "default", 30, kind="sleep", seconds=0.4)  # 6 s of work for 2 workers

    result = function.invoke(
        {"pgdrain": {"reason": "continue", "queues": ["default"], "chain": 3}}, remaining_s=6.0
    )

    assert result["ok"] is True, result
    assert result["result"]["stop_reason"] == "budget"
    assert result["result"]["more_ready"] is True
    assert result["continued"] is True
    assert spy.events() == [{"pgdrain": {"reason": "continue", "queues": ["default"], "chain": 4}}]
    (call,) = spy.calls
    assert (call["FunctionName"], call["InvocationType"]) == (FUNCTION_ARN, "Event")
    # The backlog it leaves is reported, and matches the database.
    ready = store.queue_depth(conn, ["default"]).ready
    assert ready > 0
    assert result["queue_depth"] == ready
    assert metric_totals(emf_records(capsys.readouterr().out))["QueueDepth"] == ready
    # Its exit, on the short connection after the drain, wrote its line in the run history.
    [line] = store.run_history_list(conn)
    seen = (line.trigger, line.chain, line.stop_reason, line.continued, line.done)
    assert seen == ("continue", 3, "budget", True, result["result"]["done"])


def test_a_scheduled_run_continues_with_chain_one(
    function: Function, conn: Conn, spy: InvokeSpy
) -> None:
    function.configure(PGDRAIN_RESERVE_SECONDS="2", PGDRAIN_CONCURRENCY="1", PGDRAIN_MAX_RUNS="1")
    _enqueue(conn, "default", 10, kind="sleep", seconds=0.4)

    result = function.invoke(SCHEDULED_EVENT, remaining_s=3.0)

    assert result["continued"] is True, result
    # A run of every queue (PGDRAIN_QUEUES unset) continues as one: no queues named.
    assert spy.events() == [{"pgdrain": {"reason": "continue", "chain": 1}}]


def test_an_empty_queue_never_continues(function: Function, spy: InvokeSpy) -> None:
    result = function.invoke(SCHEDULED_EVENT, remaining_s=30.0)
    assert result["ok"] is True, result
    assert (result["result"]["stop_reason"], result["result"]["more_ready"]) == ("empty", False)
    assert result["continued"] is False
    assert spy.calls == []


@pytest.mark.parametrize("reserve", ["60", "5"], ids=["takes-the-timeout", "control-below-it"])
def test_a_reserve_that_takes_the_whole_timeout_is_a_configuration_error(
    function: Function, conn: Conn, spy: InvokeSpy, reserve: str
) -> None:
    """Each run would claim nothing, and continue itself, to no end (a red team's report)."""
    function.configure(PGDRAIN_RESERVE_SECONDS=reserve)
    _enqueue(conn, "default", 3)
    result = function.invoke(
        {"pgdrain": {"reason": "enqueue", "queues": ["default"]}}, remaining_s=30.0
    )
    if reserve == "60":  # said at once, nothing touched: no continuation, no wake-up
        assert (result["ok"], result["error_kind"]) == (False, "configuration"), result
        assert "PGDRAIN_RESERVE_SECONDS (60 s)" in result["error"]
        assert spy.calls == []
        assert _statuses(conn) == {("default", "queued"): 3}
    else:
        assert (result["ok"], result["result"]["done"]) == (True, 3), result


def test_a_continuation_at_the_cap_does_not_continue(
    function: Function, conn: Conn, spy: InvokeSpy
) -> None:
    function.configure(
        PGDRAIN_MAX_CHAIN="2",
        PGDRAIN_RESERVE_SECONDS="2",
        PGDRAIN_CONCURRENCY="1",
        PGDRAIN_MAX_RUNS="1",
    )
    _enqueue(conn, "default", 10, kind="sleep", seconds=0.4)

    result = function.invoke(
        {"pgdrain": {"reason": "continue", "queues": ["default"], "chain": 2}}, remaining_s=3.0
    )

    assert result["ok"] is True, result
    assert (result["result"]["stop_reason"], result["result"]["more_ready"]) == ("budget", True)
    assert result["continued"] is False
    assert spy.calls == []
    warnings = [line["message"] for line in function.log_lines() if line["level"] == "WARNING"]
    assert any("continuation cap" in message for message in warnings)


# -- metrics ----------------------------------------------------------------------------------


def _one(conn: Conn, statement: str) -> int:
    row = conn.execute(statement).fetchone()
    assert row is not None
    return int(row[0])


def test_the_metrics_printed_match_the_database(
    function: Function, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    _enqueue(conn, "default", 10)
    _enqueue(
        conn, "default", 3, kind="flaky", failures=1
    )  # retried (10 s backoff): not ready after
    with conn.transaction():
        for _ in range(2):
            enqueue(conn, "fail", {}, max_attempts=1)
    # One job whose lease expired under a worker that died: the run reclaims it first.
    enqueue(conn, "noop", {"expired": True}, queue="default")
    (claimed,) = claim_batch(conn, ["default"], 1, "dead-worker", 30.0, None)
    conn.execute(
        "UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        (claimed.id,),
    )
    capsys.readouterr()

    result = function.invoke(SCHEDULED_EVENT)

    assert result["ok"] is True, result
    totals = metric_totals(emf_records(capsys.readouterr().out))
    assert set(totals) == set(METRIC_NAMES)
    attempts_before_the_run = 1
    assert (
        totals["JobsClaimed"]
        == _one(conn, "SELECT sum(attempts) FROM pgdrain.jobs") - attempts_before_the_run
    )
    assert totals["JobsSucceeded"] == _one(
        conn, "SELECT count(*) FROM pgdrain.jobs WHERE status = 'done'"
    )
    assert totals["JobsFailed"] == _one(
        conn, "SELECT count(*) FROM pgdrain.jobs WHERE status = 'failed'"
    )
    assert totals["JobsRetried"] == _one(
        conn, "SELECT count(*) FROM pgdrain.jobs WHERE status = 'queued' AND last_error IS NOT NULL"
    )
    assert totals["Reclaimed"] == _one(
        conn, "SELECT count(*) FROM pgdrain.jobs WHERE reclaim_count > 0"
    )
    assert totals["LeasesLost"] == totals["JobsCancelled"] == 0
    assert totals["QueueDepth"] == store.queue_depth(conn, ["default"]).ready == 0
    assert totals["OldestReadyAgeSeconds"] == 0
    assert (
        totals["JobsSucceeded"],
        totals["JobsFailed"],
        totals["JobsRetried"],
        totals["Reclaimed"],
    ) == (11, 2, 3, 1)


def test_counts_are_flushed_while_the_run_goes_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aws_lambda_powertools import Metrics

    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "pgdrain")
    printed: list[str] = []
    with ProgressMetrics(Metrics(namespace="pgdrain"), interval=0.05) as progress:
        progress.observe("claimed", 4)
        progress.observe("done", 3)

        def flushed() -> bool:
            printed.append(capsys.readouterr().out)
            return bool(emf_records("".join(printed)))

        wait_for(flushed, what="a flush before the run ends")
        during = metric_totals(emf_records("".join(printed)))
    printed.append(capsys.readouterr().out)
    assert during == {"JobsClaimed": 4, "JobsSucceeded": 3}
    # At the end, every counter is reported, zeros included.
    assert metric_totals(emf_records("".join(printed))) == {
        "JobsClaimed": 4,
        "JobsSucceeded": 3,
        "JobsRetried": 0,
        "JobsFailed": 0,
        "JobsCancelled": 0,
        "LeasesLost": 0,
        "Reclaimed": 0,
    }


# -- cold start -------------------------------------------------------------------------------


def test_the_handler_module_does_not_import_boto3() -> None:
    """boto3 loads only to kick, continue or read a secret. (Powertools itself imports the bare
    `botocore` package, for its user agent: a few hundred microseconds, no client machinery.)"""
    probe = "import sys, app; print('boto3' in sys.modules, 'botocore.client' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGDRAIN_", "AWS_"))}
    env["PYTHONPATH"] = str(ROOT / "handler")
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=ROOT / "handler",
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_powertools_service_name_names_the_service() -> None:
    """POWERTOOLS_SERVICE_NAME (template.yaml sets it) is the service in every log line, the
    library's own (pgdrain.*) included; the control without it shows the fallback."""
    probe = (
        "import app, logging; logging.getLogger('pgdrain.probe').warning('probe');"
        " print(app.logger.service)"
    )
    names = []
    for service in ("billing-drain", None):
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PGDRAIN_", "AWS_", "POWERTOOLS_"))
        }
        env["PYTHONPATH"] = str(ROOT / "handler")
        if service is not None:
            env["POWERTOOLS_SERVICE_NAME"] = service
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=env,
            cwd=ROOT / "handler",
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        *records, service = done.stdout.strip().splitlines()
        [record] = log_records("\n".join(records))  # the library's line, as JSON
        assert (record["message"], record["level"]) == ("probe", "WARNING")
        names.append((service, record["service"]))
    assert names == [("billing-drain", "billing-drain"), ("pgdrain", "pgdrain")]


# -- retention in the scheduled run ------------------------------------------------------------


def _finished_long_ago(conn: Conn, status: str, days: float, queue_name: str = "default") -> int:
    job_id = enqueue(conn, "noop", queue=queue_name)
    conn.execute(
        "UPDATE pgdrain.jobs SET status = %s, attempts = 1,"
        " finished_at = now() - %s * interval '1 day' WHERE id = %s",
        (status, days, job_id),
    )
    return job_id


@pytest.mark.parametrize(
    "event",
    [SCHEDULED_EVENT, {"pgdrain": {"reason": "enqueue", "queues": ["default"]}}],
    ids=["schedule", "control: enqueue"],
)
def test_the_scheduled_run_deletes_finished_jobs_past_their_retention(
    function: Function,
    conn: Conn,
    capsys: pytest.CaptureFixture[str],
    event: dict[str, Any],
) -> None:
    """Only the scheduled run deletes (the enqueue-triggered run, same rows, is the control);
    done jobs past PGDRAIN_RETAIN_DONE, failed and cancelled past PGDRAIN_RETAIN_FAILED; it
    reports the counts in the summary, a log line and the JobsDeleted metric."""
    function.configure(PGDRAIN_RETAIN_DONE="2", PGDRAIN_RETAIN_FAILED="10")
    old_done = _finished_long_ago(conn, "done", 3)
    young_done = _finished_long_ago(conn, "done", 1)
    old_failed = _finished_long_ago(conn, "failed", 11)
    old_cancelled = _finished_long_ago(conn, "cancelled", 11)
    young_failed = _finished_long_ago(conn, "failed", 3)
    other_queue = _finished_long_ago(conn, "done", 3, queue_name="elsewhere")
    capsys.readouterr()

    result = function.invoke(event)

    assert result["ok"] is True, result
    left = {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")}
    if result["trigger"] != "schedule":
        assert result["retention"] is None
        assert len(left) == 6
        return
    # Retention is for the table, not a queue: every queue's old rows go.
    assert left == {young_done, young_failed}
    assert not {old_done, old_failed, old_cancelled, other_queue} & left
    assert result["retention"] == {
        "done": 2,
        "failed": 2,
        "runs": 0,
        "complete": True,
        "partitions_dropped": 0,
    }
    totals = metric_totals(emf_records(capsys.readouterr().out))
    assert totals["JobsDeleted"] == 4
    [line] = [r for r in function.log_lines() if r["message"] == "retention deleted finished jobs"]
    assert (line["deleted_done"], line["deleted_failed"]) == (2, 2)


def test_an_empty_scheduled_run_deletes_in_the_round_trip_of_its_exit(
    function: Function, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One connection, two round trips after connect: the reclaim goes with the first claim,
    the retention batch with the exit (it used to open a connection of its own)."""
    function.configure(PGDRAIN_RETAIN_DONE="2")
    old = _finished_long_ago(conn, "done", 3)
    young = _finished_long_ago(conn, "done", 1)

    with traced_connections(monkeypatch) as round_trips_of:
        result = function.invoke(SCHEDULED_EVENT)
        trips = round_trips_of()

    assert result["ok"] is True, result
    assert result["retention"] == {
        "done": 1,
        "failed": 0,
        "runs": 0,
        "complete": True,
        "partitions_dropped": 0,
    }
    assert trips == [2]
    left = {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")}
    assert old not in left and young in left


def test_retention_past_one_batch_carries_on_after_the_exit(
    function: Function, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch sent with the exit came back full: the rest is deleted on a short connection
    of its own, within the run's retention share, and the counts add up."""
    function.configure(PGDRAIN_RETAIN_DONE="2")
    with conn.transaction():
        enqueue_many(conn, [build_job("noop") for _ in range(retention.DEFAULT_BATCH + 5)])
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'done', attempts = 1,"
        " finished_at = now() - interval '3 days'"
    )

    with traced_connections(monkeypatch) as round_trips_of:
        result = function.invoke(SCHEDULED_EVENT)
        connections = len(round_trips_of())

    assert result["ok"] is True, result
    assert result["retention"] == {
        "done": retention.DEFAULT_BATCH + 5,
        "failed": 0,
        "runs": 0,
        "complete": True,
        "partitions_dropped": 0,
    }
    assert connections == 2
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)


@pytest.mark.parametrize("counted", [True, False], ids=["counted-at-exit", "control-not-counted"])
def test_a_queue_at_its_limit_reports_the_jobs_it_holds_back(
    function: Function,
    conn: Conn,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    counted: bool,
) -> None:
    """A queue at its concurrency limit (its one slot held by another run) with three jobs
    ready for two minutes: the run claims none and ends `empty`. Its QueueDepth and
    OldestReadyAgeSeconds say what waits; they said 0 (an empty claim was taken for an empty
    queue), so no backlog alarm could fire while the queue was stuck."""
    import functools

    from pgdrain.aws.control import RunControl
    from pgdrain.controls import Controls

    if not counted:
        control = functools.partial(RunControl, controls=Controls(count_ready_at_exit=False))
        monkeypatch.setattr(lambda_run, "RunControl", control)
    function.configure(PGDRAIN_QUEUE_LIMITS="default=1")
    store.queue_limit_sync(conn, ["default"], [("default", 1)])
    _enqueue(conn, "default", 4)
    claim_batch(conn, ["default"], 1, "another-run", 300.0, None)
    conn.execute("UPDATE pgdrain.jobs SET run_at = now() - interval '2 minutes'")

    result = function.invoke({"pgdrain": {"reason": "enqueue", "queues": ["default"]}})

    assert result["ok"] is True, result
    assert (result["result"]["claimed"], result["result"]["stop_reason"]) == (0, "empty")
    totals = metric_totals(emf_records(capsys.readouterr().out))
    if counted:
        assert result["queue_depth"] == totals["QueueDepth"] == 3
        assert totals["OldestReadyAgeSeconds"] >= 120
    else:
        assert (totals["QueueDepth"], totals["OldestReadyAgeSeconds"]) == (0, 0)


@pytest.mark.parametrize(("reserve", "warned"), [("1", True), ("2", False)])
def test_a_reserve_too_short_to_end_a_run_is_warned_of_at_cold_start(
    caplog: pytest.LogCaptureFixture, reserve: str, warned: bool
) -> None:
    """A red team's report: with a reserve of 1 s, a run stopped for time had under 1 s left
    and ended none of its state (no wake-up, no history line, its registration left)."""
    from pgdrain.aws import run

    with caplog.at_level("WARNING", logger="pgdrain.aws.run"):
        started = run.cold_start({"PGDRAIN_RESERVE_SECONDS": reserve, "PGDRAIN_JOBS": "jobs"})
    assert started.settings is not None
    said = [
        r.getMessage() for r in caplog.records if "PGDRAIN_RESERVE_SECONDS is" in r.getMessage()
    ]
    assert bool(said) is warned, said
