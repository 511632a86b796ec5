"""What any event can make the function do to EventBridge Scheduler. A wake-up request
({"reason": "later"}) may be sent by anyone who may invoke the function (the application's
KickPolicyArn grants it): 201 forged requests made 201 one-shot schedules, one at
9999-12-31T23:59:59, each later waking the database, none touching it first. Now a request
creates a schedule only for a wake-up the database holds under the kick's own id, on the
precision, within the horizon; a Waker (one per invocation) creates at most one schedule; and
no wake-up is made further ahead than the horizon, by a run or a kick.

moto's `scheduler` service stands for EventBridge Scheduler; its schedules never fire."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    FUNCTION_ARN,
    FUNCTION_NAME,
    REGION,
    InvokeSpy,
    aws_environment,
    create_function,
    handler_env,
    invoke_handler,
    mocked_aws,
)
from pgdrain import Budget, Settings, enqueue
from pgdrain.aws import events, wake_request
from pgdrain.aws.kick import kick, kick_outcome
from pgdrain.aws.lambda_api import lambda_client
from pgdrain.aws.wake import (
    MAX_SCHEDULES_PER_WAKER,
    WAKE_HORIZON_SECONDS,
    Waker,
    reset_clients,
    wake_moment,
    wake_time,
)
from pgdrain.controls import Controls
from pgdrain.errors import BadEvent

Conn = psycopg.Connection[Any]
GROUP = "pgdrain-test-wake"
ROLE_ARN = "arn:aws:iam::123456789012:role/pgdrain-test-wake"
FORGED = 201


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import boto3

    aws_environment(monkeypatch)
    with mocked_aws():
        reset_clients()
        client = boto3.client("scheduler", region_name=REGION)
        client.create_schedule_group(Name=GROUP)
        yield client
        reset_clients()


@pytest.fixture
def settings(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    env = {
        "DATABASE_URL": db_url,
        "PGDRAIN_QUEUES": "emails,default",
        "PGDRAIN_SCHEDULE_GROUP": GROUP,
        "PGDRAIN_SCHEDULER_ROLE_ARN": ROLE_ARN,
    }
    handler_env(monkeypatch, **env)
    return Settings.from_env(env)


def _schedules(client: Any) -> int:
    pages = client.get_paginator("list_schedules").paginate(GroupName=GROUP)
    return sum(len(page["Schedules"]) for page in pages)


def _forged(n: int) -> events.Trigger:
    """A request as a forger writes it: a plausible moment on the minute, within the day, and
    a made-up id."""
    now = dt.datetime.now(dt.UTC)
    at = wake_time(now + dt.timedelta(minutes=5 + n), 60)
    return events.Trigger("later", ("emails",), wake_at=at, reserved_by=f"kick:{uuid.uuid4()}")


def _answer_all(settings: Settings, controls: Controls) -> list[dict[str, Any] | None]:
    answers = []
    for n in range(FORGED):
        waker = Waker(settings, FUNCTION_ARN, controls=controls)  # one per invocation
        answers.append(
            wake_request.answer(
                _forged(n), waker, settings.queues, Budget.seconds(30), controls=controls
            )
        )
    return answers


def test_forged_wake_up_requests_make_no_schedule(
    settings: Settings, conn: Conn, scheduler: Any
) -> None:
    answers = _answer_all(settings, Controls())
    assert all(a is not None and a["wake"] == "refused" for a in answers), answers[:2]
    assert _schedules(scheduler) == 0
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)  # no run


def test_control_without_the_checks_each_forged_request_is_a_schedule(
    settings: Settings, scheduler: Any
) -> None:
    """The control: the same 201 requests with the database's record not asked, as before:
    201 schedules, each of which would wake the database."""
    answers = _answer_all(settings, Controls(check_wake_requests=False))
    assert all(a is not None and a["wake"] == "created" for a in answers)
    assert _schedules(scheduler) == FORGED


def test_a_forged_request_through_the_handler_runs_nothing(
    settings: Settings, conn: Conn, scheduler: Any
) -> None:
    """Through the function: the made-up id is refused (one WARNING, no schedule, no drain of
    the ready job); a moment off the minute or 9999-12-31T23:59:59 is a bad event."""
    with conn.transaction():
        job = enqueue(conn, "noop", {}, queue="emails")
    forged = _forged(0)
    assert forged.wake_at is not None
    event = events.later_event(["emails"], forged.wake_at, "kick:made-up")
    result = invoke_handler(event)
    assert (result["ok"], result["wake"]) == (True, "refused"), result
    assert "result" not in result
    for at in ("9999-12-31T23:59:59+00:00", "2026-12-01T04:14:07+00:00"):
        odd = {"pgdrain": {**event["pgdrain"], "at": at}}
        refused = invoke_handler(odd)
        assert refused["ok"] is False and "not a wake-up moment" in refused["error"], refused
        with pytest.raises(BadEvent):
            events.parse(odd, settings)
    assert _schedules(scheduler) == 0
    status = conn.execute("SELECT status FROM pgdrain.jobs WHERE id = %s", (job,)).fetchone()
    assert status == ("queued",)


def test_a_request_past_the_horizon_drains_instead(
    settings: Settings, conn: Conn, scheduler: Any
) -> None:
    """A moment a kick could not have asked for (past the horizon): no schedule; the request
    becomes a run, as one whose schedule could not be made, and that run's own wake-up is
    within the horizon."""
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails", delay=30 * 86400)
    far = wake_time(dt.datetime.now(dt.UTC) + dt.timedelta(days=30), 60)
    result = invoke_handler(events.later_event(["emails"], far, "kick:made-up"))
    assert result["result"]["stop_reason"] == "empty", result
    wake_at = dt.datetime.fromisoformat(result["wake_at"])
    horizon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=WAKE_HORIZON_SECONDS + 60)
    assert wake_at <= horizon and result["wake"] == "created"


def test_a_kicks_own_request_makes_its_schedule(
    settings: Settings, conn: Conn, scheduler: Any
) -> None:
    create_function()
    spy = InvokeSpy()
    from pgdrain.aws.lambda_api import lambda_client

    client = spy.attach(lambda_client(REGION))
    kicker = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails", delay=600)
    assert kick(conn, ["emails"], settings=kicker, client=client) == ()
    (request,) = spy.events()
    answered = invoke_handler(request)
    assert (answered["ok"], answered["wake"]) == (True, "created"), answered
    assert _schedules(scheduler) == 1


def test_a_delayed_job_past_the_horizon_is_woken_for_at_the_horizon(
    settings: Settings, conn: Conn, scheduler: Any
) -> None:
    """By a kick and by a run alike: the wake-up (and its schedule) at most a horizon ahead;
    the run there finds the job still due and wakes for it again."""
    create_function()
    spy = InvokeSpy()
    from pgdrain.aws.lambda_api import lambda_client

    client = spy.attach(lambda_client(REGION))
    kicker = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails", delay=365 * 86400)
    # A horizon ahead of the moment the kick (then the run) reads the clock, rounded up to the
    # minute: at most a horizon and a minute after the call returned, whichever minute that
    # moment fell in (a bound taken before the call fails when the call crosses a minute).
    horizon = dt.timedelta(seconds=WAKE_HORIZON_SECONDS)
    kick(conn, ["emails"], settings=kicker, client=client)
    (request,) = spy.events()
    at = dt.datetime.fromisoformat(request["pgdrain"]["at"])
    assert at <= dt.datetime.now(dt.UTC) + horizon + dt.timedelta(minutes=1)
    assert invoke_handler(request)["wake"] == "created"
    ran = invoke_handler({"pgdrain": {"reason": "enqueue", "queues": ["emails"]}})
    wake_at = dt.datetime.fromisoformat(ran["wake_at"])
    assert wake_at <= dt.datetime.now(dt.UTC) + horizon + dt.timedelta(minutes=1)


def test_the_horizon_bounds_the_moment_and_keeps_the_precision() -> None:
    now = dt.datetime(2026, 12, 1, 4, 13, 30, tzinfo=dt.UTC)
    far = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
    assert wake_moment(far, 60, now) == dt.datetime(2026, 12, 2, 4, 14, tzinfo=dt.UTC)
    soon = now + dt.timedelta(minutes=10)
    assert wake_moment(soon, 60, now) == wake_time(soon, 60)
    # The control: the rounding alone (the rule before) keeps the year 9999, or fails past it.
    assert wake_time(far - dt.timedelta(seconds=59), 60).year == 9999
    with pytest.raises(ValueError, match="year 10000 is out of range"):
        wake_time(far, 60)


def test_one_waker_creates_one_schedule(settings: Settings, scheduler: Any) -> None:
    waker = Waker(settings, FUNCTION_ARN)
    first, second = _forged(1).wake_at, _forged(2).wake_at
    assert first is not None and second is not None
    assert waker.ensure_without_database(["emails"], first).action == "created"
    assert waker.ensure_without_database(["emails"], second).action == "failed"
    assert _schedules(scheduler) == MAX_SCHEDULES_PER_WAKER == 1


def test_control_without_the_cap_one_waker_creates_many(settings: Settings, scheduler: Any) -> None:
    waker = Waker(settings, FUNCTION_ARN, controls=Controls(cap_wake_schedules=False))
    for n in range(5):
        moment = _forged(n).wake_at
        assert moment is not None
        assert waker.ensure_without_database(["emails"], moment).action == "created"
    assert _schedules(scheduler) == 5


def _spied_function() -> tuple[InvokeSpy, Any]:
    """The drain function, and a Lambda client whose invocations the spy keeps."""
    create_function()
    spy = InvokeSpy()
    return spy, spy.attach(lambda_client(REGION))


def _kick_a_delayed_job_whose_request_cannot_reach_the_database(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, client: Any, spy: InvokeSpy
) -> None:
    """A kick reserves the wake-up of a delayed job and invokes the function, which cannot
    reach the database (it is down, or the request never comes): no schedule."""
    kicker = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails", delay=600)
    kick(conn, ["emails"], settings=kicker, client=client)
    (request,) = spy.events()
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/pgdrain")
    monkeypatch.setenv("PGDRAIN_CONNECT_TIMEOUT", "2")
    failed = invoke_handler(request, remaining_s=4.0)
    assert failed["ok"] is False and "database" in failed["error"], failed


def _the_next_kick(conn: Conn, db_url: str, monkeypatch: pytest.MonkeyPatch, client: Any) -> Any:
    monkeypatch.setenv("DATABASE_URL", db_url)
    kicker = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails", delay=600)
    return kick_outcome(conn, ["emails"], settings=kicker, client=client)


def test_a_request_that_never_took_up_its_wake_up_holds_the_next_kicks_briefly(
    settings: Settings,
    db_url: str,
    conn: Conn,
    scheduler: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reservation the request did not take up holds WAKE_HOLD_SECONDS (the database's
    clock moved past it here): the next kick makes the wake-up again, and its request creates
    the schedule."""
    spy, client = _spied_function()
    _kick_a_delayed_job_whose_request_cannot_reach_the_database(conn, monkeypatch, client, spy)
    state = conn.execute("SELECT state FROM pgdrain.wakes").fetchone()
    assert state == ("creating",)
    conn.execute("UPDATE pgdrain.wakes SET reserved_until = now() - interval '1 second'")
    again = _the_next_kick(conn, db_url, monkeypatch, client)
    assert len(again.wakes) == 1 and again.covered == (), again
    answered = invoke_handler(spy.events()[-1])
    assert (answered["ok"], answered["wake"]) == (True, "created"), answered
    assert _schedules(scheduler) == 1


def test_control_a_wake_up_recorded_created_by_the_kick_strands_the_jobs(
    settings: Settings,
    db_url: str,
    conn: Conn,
    scheduler: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the same timeline with the kick's wake-up recorded created, as a kick did
    before: every later kick trusts it (`covered`), no schedule exists, and the jobs wait for
    the hourly schedule (a red team's finding)."""
    spy, client = _spied_function()
    _kick_a_delayed_job_whose_request_cannot_reach_the_database(conn, monkeypatch, client, spy)
    conn.execute("UPDATE pgdrain.wakes SET state = 'created'")
    conn.execute("UPDATE pgdrain.wakes SET reserved_until = now() - interval '1 second'")
    again = _the_next_kick(conn, db_url, monkeypatch, client)
    assert again.wakes == () and again.covered == ("emails",), again
    assert len(spy.events()) == 1 and _schedules(scheduler) == 0


def test_a_kick_without_boto_releases_the_wake_up_it_reserved(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application installed without the [aws] extra: the kick of a delayed job says what to
    install, raises nothing, and leaves no reservation behind."""
    import builtins

    real_import = builtins.__import__

    def without_botocore(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] in ("boto3", "botocore"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    kicker = Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails", delay=600)
    monkeypatch.setattr(builtins, "__import__", without_botocore)
    outcome = kick_outcome(conn, ["emails"], settings=kicker)
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert outcome.error is not None and "install pgdrain[aws]" in outcome.error, outcome
    assert outcome.wakes == ()
    assert conn.execute("SELECT count(*) FROM pgdrain.wakes").fetchone() == (0,)
