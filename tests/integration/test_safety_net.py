"""The sliding safety net (pgdrain.aws.safety_net), against moto's `scheduler` service: a run
that ends having found every queue empty moves the one safety-net schedule to ScheduleRate after
itself, and a tick of the rate schedule while that one is pending returns without touching the
database. Without the slide (the control: no PGDRAIN_SCHEDULE_RATE), every tick connects."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    REGION,
    aws_environment,
    emf_records,
    handler_env,
    invoke_handler,
    metric_totals,
    mocked_aws,
)
from pgdrain import enqueue
from pgdrain.aws import events
from pgdrain.aws import run as lambda_run
from pgdrain.aws.safety_net import SAFETY_SCHEDULE, forget_last_set
from pgdrain.aws.wake import WAKE_FAILED_METRIC, at_expression, reset_clients, wake_time

Conn = psycopg.Connection[Any]
GROUP = "pgdrain-test-safety"
ROLE_ARN = "arn:aws:iam::123456789012:role/pgdrain-test-wake"
CLOSED_PORT_URL = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
ENQUEUE = events.enqueue_event(["emails"])
TICK = {
    "version": "0",
    "id": "7c2f4a1e-0000-4000-8000-000000000001",
    "detail-type": "Scheduled Event",
    "source": "aws.scheduler",
    "detail": "{}",
}


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import boto3

    aws_environment(monkeypatch)
    monkeypatch.setattr(lambda_run, "_retention_ran_at", None)
    forget_last_set()
    with mocked_aws():
        reset_clients()
        client = boto3.client("scheduler", region_name=REGION)
        client.create_schedule_group(Name=GROUP)
        yield client
        reset_clients()
    forget_last_set()


def _env(monkeypatch: pytest.MonkeyPatch, db_url: str, rate: str | None = "1 hour") -> None:
    handler_env(
        monkeypatch,
        DATABASE_URL=db_url,
        PGDRAIN_QUEUES="emails,default",
        PGDRAIN_SCHEDULE_GROUP=GROUP,
        PGDRAIN_SCHEDULER_ROLE_ARN=ROLE_ARN,
        **({} if rate is None else {"PGDRAIN_SCHEDULE_RATE": rate}),
    )


def _safety(client: Any) -> dict[str, Any] | None:
    try:
        return client.get_schedule(Name=SAFETY_SCHEDULE, GroupName=GROUP)  # type: ignore[no-any-return]
    except client.exceptions.ResourceNotFoundException:
        return None


def test_a_run_that_finds_every_queue_empty_moves_the_safety_net(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, db_url)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")

    before = dt.datetime.now(dt.UTC)
    first = invoke_handler(ENQUEUE)
    after = dt.datetime.now(dt.UTC)

    assert (first["result"]["done"], first["safety_net"]) == (1, "created")
    at = dt.datetime.fromisoformat(first["safety_net_at"])
    hour = dt.timedelta(hours=1)
    assert wake_time(before + hour, 60) <= at <= wake_time(after + hour, 60)
    schedule = _safety(scheduler)
    assert schedule is not None
    assert schedule["ScheduleExpression"] == at_expression(at)
    assert schedule["ActionAfterCompletion"] == "DELETE"
    assert json.loads(schedule["Target"]["Input"]) == events.safety_event()
    assert first["retention"] is not None  # it stands in for the safety-net run: housekeeping

    forget_last_set()  # the next run in another execution environment
    monkeypatch.setattr(lambda_run, "_retention_ran_at", None)
    second = invoke_handler(ENQUEUE)
    assert second["safety_net"] == "moved"
    assert dt.datetime.fromisoformat(second["safety_net_at"]) >= at
    again = invoke_handler(ENQUEUE)  # the same environment, the same minute: no call at all
    assert again["safety_net"] in ("unchanged", "moved")  # "moved" only if a minute turned
    assert again["retention"] is None  # once per ScheduleRate per environment


@pytest.mark.parametrize("rate", ["1 hour", None], ids=["sliding", "control-rate-only"])
def test_a_tick_while_the_safety_net_is_pending_touches_no_database(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch, rate: str | None
) -> None:
    """The same timeline: a kicked run finds every queue empty, then the rate schedule ticks
    with the database unreachable. Sliding, the tick answers from the pending schedule; with
    the rate schedule alone (the control), it connects, and here fails for it."""
    _env(monkeypatch, db_url, rate)
    assert "result" in invoke_handler(ENQUEUE)

    monkeypatch.setenv("DATABASE_URL", CLOSED_PORT_URL)
    # A short budget: the control retries its connect until the budget runs out.
    tick = invoke_handler(TICK, remaining_s=8.0)

    if rate is not None:
        assert (tick["ok"], tick["skipped"]) == (True, True), tick
        pending = _safety(scheduler)
        assert pending is not None
        at = dt.datetime.fromisoformat(tick["safety_net_at"])
        assert pending["ScheduleExpression"] == at_expression(at)
    else:
        assert tick["ok"] is False and "database" in tick["error"], tick
        assert _safety(scheduler) is None


def test_without_a_pending_safety_net_the_tick_runs(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never made, or deleted after it fired: the tick is a scheduled run as it always was."""
    _env(monkeypatch, db_url)
    tick = invoke_handler(TICK)
    assert tick["trigger"] == "schedule" and tick["result"]["stop_reason"] == "empty", tick
    assert tick["safety_net"] == "created"  # and it starts the slide


def test_the_safety_net_run_is_a_scheduled_run(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, db_url)
    result = invoke_handler(events.safety_event())
    assert result["trigger"] == "safety"
    assert set(result["queues"]) == {"emails", "default"}
    assert result["retention"] is not None
    assert result["safety_net"] == "created"  # the next one, ScheduleRate after it


def test_a_run_that_leaves_a_queue_unchecked_or_work_behind_moves_nothing(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, db_url)
    woken = invoke_handler(events.wake_event(["emails"]))  # drains emails only: default unchecked
    assert woken["result"]["stop_reason"] == "empty"
    assert "safety_net" not in woken
    assert _safety(scheduler) is None


def test_a_failed_move_is_logged_and_counted_and_the_next_tick_runs(
    db_url: str,
    conn: Conn,
    scheduler: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from botocore.stub import Stubber

    from pgdrain.aws import wake

    _env(monkeypatch, db_url)
    failing = wake.scheduler_client(REGION)
    with Stubber(failing) as stub:
        stub.add_client_error("update_schedule", "InternalServerException", http_status_code=500)
        result = invoke_handler(ENQUEUE)
        stub.assert_no_pending_responses()

    assert (result["ok"], result["safety_net"]) == (True, "failed")  # the run succeeded
    assert metric_totals(emf_records(capsys.readouterr().out)).get(WAKE_FAILED_METRIC) == 1
    assert any(
        "could not move the safety-net schedule" in r.getMessage()
        for r in caplog.records
        if r.levelname == "ERROR"
    )
    tick = invoke_handler(TICK)  # nothing pending: it runs
    assert tick["result"]["stop_reason"] == "empty"
