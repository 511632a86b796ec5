"""Wake-ups (pgdrain.aws.wake): a run that ends with work due later makes sure of one
EventBridge Scheduler one-shot at that moment, here moto's `scheduler` service. Pending
wake-ups live in pgdrain.wakes: runs ending together make one schedule, an earlier pending
wake-up suppresses a later one, and a failed creation suppresses nothing."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    FUNCTION_ARN,
    REGION,
    aws_environment,
    emf_records,
    handler_env,
    invoke_handler,
    metric_totals,
    mocked_aws,
)
from helpers.fixtures import complete_and_claim
from pgdrain import Budget, Settings, enqueue
from pgdrain.aws import events
from pgdrain.aws import run as lambda_run
from pgdrain.aws.run import DEPTH_MIN_REMAINING_SECONDS
from pgdrain.aws.wake import (
    WAKE_FAILED_METRIC,
    Waker,
    at_expression,
    reset_clients,
    schedule_name,
    wake_time,
)
from pgdrain.db import store
from pgdrain.db.session import Session

Conn = psycopg.Connection[Any]
GROUP = "pgdrain-test-wake"
ROLE_ARN = "arn:aws:iam::123456789012:role/pgdrain-test-wake"


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


def _handler_env(monkeypatch: pytest.MonkeyPatch, db_url: str, **extra: str) -> None:
    env = {
        "DATABASE_URL": db_url,
        "PGDRAIN_QUEUES": "emails,default",
        "PGDRAIN_SCHEDULE_GROUP": GROUP,
        "PGDRAIN_SCHEDULER_ROLE_ARN": ROLE_ARN,
    }
    handler_env(monkeypatch, **(env | extra))


def _schedules(client: Any) -> list[dict[str, Any]]:
    names = [s["Name"] for s in client.list_schedules(GroupName=GROUP)["Schedules"]]
    return [client.get_schedule(Name=n, GroupName=GROUP) for n in names]


def _delayed(conn: Conn, queue: str, seconds: float) -> dt.datetime:
    with conn.transaction():
        job_id = enqueue(conn, "noop", {}, queue=queue, delay=seconds)
    row = conn.execute("SELECT run_at FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


ENQUEUE_EMAILS = {"pgdrain": {"reason": "enqueue", "queues": ["emails"]}}


# -- the moment, pure ---------------------------------------------------------------------------


def test_the_wake_time_is_rounded_up_to_the_precision_in_utc() -> None:
    due = dt.datetime(2026, 12, 1, 6, 13, 0, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert wake_time(due, 60) == dt.datetime(2026, 12, 1, 4, 14, tzinfo=dt.UTC)
    on_the_minute = dt.datetime(2026, 12, 1, 4, 14, tzinfo=dt.UTC)
    assert wake_time(on_the_minute, 60) == on_the_minute  # never later than needed
    assert wake_time(due, 5) == dt.datetime(2026, 12, 1, 4, 13, 5, tzinfo=dt.UTC)  # scaled
    assert at_expression(wake_time(due, 60)) == "at(2026-12-01T04:14:00)"


def test_the_schedule_name_is_one_per_moment_and_set_of_queues() -> None:
    at = dt.datetime(2026, 12, 1, 4, 14, tzinfo=dt.UTC)
    name = schedule_name(["emails", "default"], at)
    assert name == schedule_name(["default", "emails"], at)
    assert name != schedule_name(["emails"], at)
    assert name != schedule_name(["emails", "default"], at + dt.timedelta(minutes=1))
    assert len(name) <= 64 and name.startswith("pgdrain-wake-20261201T041400-")


# -- through the handler ------------------------------------------------------------------------


def test_a_run_that_ends_with_a_delayed_job_schedules_one_wake_up(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url)
    run_at = _delayed(conn, "emails", 600)

    result = invoke_handler(ENQUEUE_EMAILS)

    assert result["ok"] is True, result
    assert result["result"]["done"] == 0  # nothing was due: the kick found nothing to run
    expected = wake_time(run_at, 60)
    assert (result["wake"], result["wake_at"]) == ("created", expected.isoformat())
    (schedule,) = _schedules(scheduler)
    # A kicked run drains every queue of the function: the wake-up is for all of them.
    name = schedule_name(["emails", "default"], expected)
    assert schedule["Name"] == name == result["wake_schedule"]
    assert schedule["ScheduleExpression"] == at_expression(expected)
    assert schedule["ScheduleExpressionTimezone"] == "UTC"
    assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert schedule["ActionAfterCompletion"] == "DELETE"
    assert schedule["Target"]["Arn"] == FUNCTION_ARN
    assert schedule["Target"]["RoleArn"] == ROLE_ARN
    wake = json.loads(schedule["Target"]["Input"])
    assert wake == events.wake_event(["default", "emails"])
    trigger = events.parse(wake, Settings(queues=("emails", "default")))
    assert (trigger.reason, trigger.queues, trigger.chain) == ("wake", ("default", "emails"), 0)


def test_a_wake_event_naming_other_queues_starts_no_chain_of_its_own(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's report: a wake event sent by hand, naming a set of queues of its own, made
    its run wake up for that set, and each woken run again, for as long as work was due in it:
    one chain of wake-ups per set of names sent. Now every run wakes the function's queues."""
    _handler_env(monkeypatch, db_url)
    run_at = _delayed(conn, "emails", 600)
    expected = wake_time(run_at, 60)

    by_hand = invoke_handler({"pgdrain": {"reason": "wake", "queues": ["emails"]}})
    kicked = invoke_handler(ENQUEUE_EMAILS)

    assert (by_hand["wake"], kicked["wake"]) == ("created", "pending"), (by_hand, kicked)
    (schedule,) = _schedules(scheduler)
    assert schedule["Name"] == schedule_name(["emails", "default"], expected)
    assert json.loads(schedule["Target"]["Input"]) == events.wake_event(["default", "emails"])
    # A wake-up for the event's own set would have been a schedule of its own.
    assert schedule_name(["emails"], expected) != schedule["Name"]


def test_runs_ending_one_after_another_make_one_schedule_and_an_earlier_one_wins(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url)
    _delayed(conn, "emails", 900)

    assert invoke_handler(ENQUEUE_EMAILS)["wake"] == "created"
    assert invoke_handler(ENQUEUE_EMAILS)["wake"] == "pending"  # the same moment: pending already
    assert len(_schedules(scheduler)) == 1

    earlier = _delayed(conn, "emails", 300)
    second = invoke_handler(ENQUEUE_EMAILS)
    assert (second["wake"], second["wake_at"]) == ("created", wake_time(earlier, 60).isoformat())
    _delayed(conn, "emails", 600)  # due between the two: the earlier pending one covers it
    assert invoke_handler(ENQUEUE_EMAILS)["wake"] == "pending"
    assert len(_schedules(scheduler)) == 2


def test_an_existing_schedule_of_the_same_name_is_success(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url)
    _delayed(conn, "emails", 600)
    assert invoke_handler(ENQUEUE_EMAILS)["wake"] == "created"
    conn.execute("DELETE FROM pgdrain.wakes")  # forgotten (say, its moment passed and came back)

    result = invoke_handler(ENQUEUE_EMAILS)

    assert result["ok"] is True
    assert result["wake"] == "exists"  # CreateSchedule said ConflictException
    assert len(_schedules(scheduler)) == 1


def test_a_lease_held_by_another_run_is_work_due_at_its_expiry(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    (held,) = complete_and_claim(conn, [], ["emails"], 1, "a-run-that-dies", 120, None)[1]
    row = conn.execute("SELECT lease_expires_at FROM pgdrain.jobs WHERE id = %s", (held.id,))
    expiry = row.fetchone()[0]  # type: ignore[index]

    result = invoke_handler(ENQUEUE_EMAILS)

    assert result["wake_at"] == wake_time(expiry, 60).isoformat()
    assert result["wake"] == "created"


def test_locally_the_wake_up_is_only_reported(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url, PGDRAIN_SCHEDULE_GROUP="", PGDRAIN_SCHEDULER_ROLE_ARN="")
    run_at = _delayed(conn, "emails", 600)

    result = invoke_handler(ENQUEUE_EMAILS)

    assert (result["wake"], result["wake_at"]) == ("reported", wake_time(run_at, 60).isoformat())
    assert _schedules(scheduler) == []
    assert conn.execute("SELECT count(*) FROM pgdrain.wakes").fetchone() == (0,)


def test_nothing_due_means_no_wake_up(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url)
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")
    result = invoke_handler(ENQUEUE_EMAILS)
    assert (result["result"]["done"], result["wake"], result["wake_at"]) == (1, "none", None)
    assert _schedules(scheduler) == []


# -- failure: logged, counted, never fails the run, and suppresses no retry ---------------------


@pytest.mark.parametrize("released", [True, False], ids=["released", "control-kept"])
def test_a_failed_creation_is_logged_and_suppresses_no_later_attempt(
    db_url: str,
    conn: Conn,
    scheduler: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    released: bool,
) -> None:
    from botocore.stub import Stubber

    from pgdrain.aws import wake

    _handler_env(monkeypatch, db_url)
    _delayed(conn, "emails", 600)
    failing = wake.scheduler_client(REGION)
    with Stubber(failing) as stub:
        stub.add_client_error("create_schedule", "ThrottlingException", http_status_code=429)
        result = invoke_handler(ENQUEUE_EMAILS)
        stub.assert_no_pending_responses()

    assert result["ok"] is True, result  # the run itself succeeded
    assert result["wake"] == "failed"
    out = capsys.readouterr().out
    assert metric_totals(emf_records(out)).get(WAKE_FAILED_METRIC) == 1
    (logged,) = [
        r for r in caplog.records if r.name == "pgdrain.aws.wake" and r.levelname == "ERROR"
    ]
    assert "could not create the wake-up schedule" in logged.getMessage()
    if not released:  # the control: the failed run's reservation, had it not been released
        conn.execute(
            "INSERT INTO pgdrain.wakes VALUES ('default,emails', %s, 'creating', 'the-failed-run',"
            " now() + interval '30 seconds')",
            (dt.datetime.fromisoformat(result["wake_at"]),),
        )

    again = invoke_handler(ENQUEUE_EMAILS)  # the next run to end

    assert again["wake"] == ("created" if released else "pending")
    assert len(_schedules(scheduler)) == (1 if released else 0)


def test_a_reservation_whose_run_died_holds_only_briefly(conn: Conn) -> None:
    at = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
    assert store.wake_reserve(conn, "emails", at, "run-a", 30) is not None
    assert store.wake_reserve(conn, "emails", at, "run-b", 30) is None  # held by run-a
    assert store.wake_reserve(conn, "emails", at, "run-a", 30) is not None  # run-a's retry
    conn.execute("UPDATE pgdrain.wakes SET reserved_until = now() - interval '1 second'")
    assert store.wake_reserve(conn, "emails", at, "run-b", 30) is not None  # run-a died


# -- runs ending at once ------------------------------------------------------------------------


def test_runs_ending_at_the_same_moment_create_one_schedule(
    db_url: str, conn: Conn, scheduler: Any
) -> None:
    """Eight runs reach their wake-up together (a barrier); one creates, the rest find it
    pending, however the reservations interleave."""
    runs = 8
    due = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=7)
    settings = Settings(schedule_group=GROUP, scheduler_role_arn=ROLE_ARN, queues=("emails",))
    barrier = threading.Barrier(runs)
    outcomes: list[str] = []
    errors: list[BaseException] = []
    client = scheduler

    def one(i: int) -> None:
        try:
            session = Session(db_url, settings, Budget.seconds(30))
            session.open()
            try:
                waker = Waker(settings, FUNCTION_ARN, client=client)
                barrier.wait()
                outcomes.append(waker.ensure(session, due, f"run-{i}").action)
            finally:
                session.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sorted(outcomes) == ["created"] + ["pending"] * (runs - 1)
    assert len(_schedules(scheduler)) == 1


def test_a_run_that_stops_for_time_also_schedules_its_wake_up(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped by its reserve (not by an empty claim), it ends its control-plane state on the
    short connection it opens after the drain, wake-up included."""
    _handler_env(monkeypatch, db_url, PGDRAIN_RESERVE_SECONDS="4", PGDRAIN_MAX_RUNS="1")
    with conn.transaction():
        enqueue(conn, "sleep", {"seconds": 2.5}, queue="emails")
    run_at = _delayed(conn, "emails", 600)

    result = invoke_handler(ENQUEUE_EMAILS, remaining_s=6.0)

    assert result["result"]["stop_reason"] == "budget", result
    assert (result["result"]["done"], result["continued"]) == (1, False)
    assert (result["wake"], result["wake_at"]) == ("created", wake_time(run_at, 60).isoformat())
    assert conn.execute("SELECT count(*) FROM pgdrain.runs").fetchone() == (0,)  # unregistered


@pytest.mark.parametrize("ends", [True, False], ids=["ends-its-run", "control-skips-it"])
def test_a_run_stopped_for_time_with_under_2_5_s_left_still_schedules_its_wake_up(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch, ends: bool
) -> None:
    """A red team's finding: a job ran past the reserve and ended with less than the 2.5 s the
    queue depth's connection needs; the run's end (its wake-up, its kick window) was skipped
    with the depth, and a job due in 10 minutes waited for the hourly schedule. The control:
    the end skipped below the depth's threshold, as before."""
    if not ends:
        monkeypatch.setattr(lambda_run, "EXIT_MIN_REMAINING_SECONDS", DEPTH_MIN_REMAINING_SECONDS)
    _handler_env(monkeypatch, db_url, PGDRAIN_RESERVE_SECONDS="3", PGDRAIN_MAX_RUNS="1")
    with conn.transaction():
        enqueue(conn, "sleep", {"seconds": 4.2}, queue="emails")  # ends about 1.7 s before
    run_at = _delayed(conn, "emails", 600)

    result = invoke_handler(ENQUEUE_EMAILS, remaining_s=6.0)

    assert result["result"]["stop_reason"] == "budget", result
    if ends:
        assert (result["wake"], result["wake_at"]) == ("created", wake_time(run_at, 60).isoformat())
        assert conn.execute("SELECT count(*) FROM pgdrain.runs").fetchone() == (0,)
    else:
        assert (result["wake"], _schedules(scheduler)) == ("none", [])


def _kicker(monkeypatch: pytest.MonkeyPatch, db_url: str) -> tuple[Any, Any, Settings]:
    from helpers.aws import FUNCTION_NAME, InvokeSpy, create_function
    from pgdrain.aws.lambda_api import lambda_client

    _handler_env(monkeypatch, db_url)
    create_function()
    spy = InvokeSpy()
    client = spy.attach(lambda_client(REGION))
    return spy, client, Settings(function_name=FUNCTION_NAME, kick_debounce_seconds=0)


def test_kicking_a_delayed_job_asks_for_its_wake_up_and_starts_no_run(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kicked delayed job is started by a wake-up at its run_at, not by a run now that finds
    nothing: the kick reserves the wake-up and sends a wake-up request, which takes up that
    reservation and creates the schedule, without a run (tests/integration/test_wake_requests.py
    shows what it refuses)."""
    from pgdrain.aws.kick import kick

    spy, client, settings = _kicker(monkeypatch, db_url)
    run_at = _delayed(conn, "emails", 600)

    assert kick(conn, ["emails"], settings=settings, client=client) == ()  # no run now

    (request,) = spy.events()
    wake_at = wake_time(run_at, 60)
    assert request["pgdrain"]["reason"] == "later"
    assert (request["pgdrain"]["queues"], request["pgdrain"]["at"]) == (
        ["emails"],
        wake_at.isoformat(),
    )
    row = conn.execute("SELECT queue_set, wake_at, state FROM pgdrain.wakes").fetchone()
    assert row == ("emails", wake_at, "creating")
    answered = invoke_handler(request)
    state = conn.execute("SELECT state FROM pgdrain.wakes").fetchone()
    assert state == ("created",)
    again = invoke_handler(request)  # a duplicate delivery: the same schedule, which exists

    assert (answered["ok"], answered["wake"], answered["wake_at"]) == (
        True,
        "created",
        wake_at.isoformat(),
    )
    assert "result" not in answered  # no drain ran
    assert again["wake"] == "exists"
    (schedule,) = _schedules(scheduler)
    assert schedule["ScheduleExpression"] == at_expression(wake_at)
    # For every queue of the function, as a kicked run's wake-up: a run that ends with the
    # same job due names the same schedule, and nothing runs twice at that minute.
    assert json.loads(schedule["Target"]["Input"]) == events.wake_event(["default", "emails"])
    assert invoke_handler(ENQUEUE_EMAILS)["wake"] == "exists"
    assert len(_schedules(scheduler)) == 1


def test_a_kick_whose_job_is_covered_by_a_pending_wake_up_sends_nothing(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a job due before every pending wake-up of its queue asks for a new one; a job
    ready now always starts a run."""
    from pgdrain.aws.kick import kick

    spy, client, settings = _kicker(monkeypatch, db_url)
    _delayed(conn, "emails", 600)
    assert kick(conn, ["emails"], settings=settings, client=client) == ()
    assert len(spy.calls) == 1  # the wake-up request

    _delayed(conn, "emails", 1200)  # due after the pending wake-up: its run will see it
    assert kick(conn, ["emails"], settings=settings, client=client) == ()
    assert len(spy.calls) == 1
    earlier = _delayed(conn, "emails", 120)  # due before it: an earlier wake-up
    assert kick(conn, ["emails"], settings=settings, client=client) == ()
    assert spy.events()[-1]["pgdrain"]["at"] == wake_time(earlier, 60).isoformat()
    with conn.transaction():
        enqueue(conn, "noop", {}, queue="emails")  # ready now: always a run
    assert kick(conn, ["emails"], settings=settings, client=client) == ("emails",)
    assert spy.events()[-1] == events.enqueue_event(["emails"])
    assert len(spy.calls) == 3


def test_a_kick_while_a_live_run_drains_the_queue_leaves_the_wake_up_to_that_run(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run that holds the queue's kicks sees the delayed job when it exits."""
    from pgdrain.aws.kick import kick

    spy, client, settings = _kicker(monkeypatch, db_url)
    conn.execute(  # what a live run's registration leaves: the queue's kicks held
        "INSERT INTO pgdrain.kicks (queue, kicked_at, requested_at, run_until)"
        " VALUES ('emails', now(), now(), now() + interval '30 seconds')"
    )
    _delayed(conn, "emails", 600)

    assert kick(conn, ["emails"], settings=settings, client=client) == ()
    assert spy.calls == []
    assert conn.execute("SELECT count(*) FROM pgdrain.wakes").fetchone() == (0,)


@pytest.mark.parametrize("forgotten", [True, False], ids=["forgotten", "control-kept"])
def test_a_wake_up_request_that_cannot_create_its_schedule_becomes_a_run_that_does(
    db_url: str,
    conn: Conn,
    scheduler: Any,
    monkeypatch: pytest.MonkeyPatch,
    forgotten: bool,
) -> None:
    """The creation fails: the request drops the kick's record and drains as a kicked run,
    whose own wake-up (the function's) then succeeds. The control keeps the record (as if
    nothing dropped it): it stays, saying a wake-up of the kicked queues is pending that does
    not exist, which the next kicks of those queues would trust."""
    from botocore.stub import Stubber

    from pgdrain.aws import wake, wake_request
    from pgdrain.aws.kick import kick

    spy, client, settings = _kicker(monkeypatch, db_url)
    run_at = _delayed(conn, "emails", 600)
    kick(conn, ["emails"], settings=settings, client=client)
    (request,) = spy.events()
    if not forgotten:
        monkeypatch.setattr(wake_request, "forget", lambda *_args: None)
    failing = wake.scheduler_client(REGION)
    with Stubber(failing) as stub:
        stub.add_client_error("create_schedule", "ThrottlingException", http_status_code=429)
        stub.add_response("create_schedule", {"ScheduleArn": "arn:aws:scheduler:::schedule/x"})
        result = invoke_handler(request)

    assert result["ok"] is True, result
    assert result["result"]["stop_reason"] == "empty"  # it drained: nothing was ready
    assert (result["wake"], result["wake_at"]) == ("created", wake_time(run_at, 60).isoformat())
    kicked_record = conn.execute("SELECT 1 FROM pgdrain.wakes WHERE queue_set = 'emails'")
    assert len(kicked_record.fetchall()) == (0 if forgotten else 1)  # the control: stale


def _latest_next_step(after: dt.datetime) -> dt.datetime:
    """The latest wake-up a run that ended by `after` asks for work already due: a second on
    (Waker.ensure: a schedule cannot fire in the past), rounded up to the minute. Not `after` + a
    minute: a run ending in a minute's last second asks for the minute after the next."""
    return wake_time(after + dt.timedelta(seconds=1), 60)


def test_work_already_due_is_woken_for_at_the_next_step_never_in_the_past(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler_env(monkeypatch, db_url, PGDRAIN_RECLAIM_LIMIT="1")
    with conn.transaction():
        for _ in range(2):
            enqueue(conn, "noop", {}, queue="emails")
    complete_and_claim(conn, [], ["emails"], 2, "a-dead-run", 30, None)
    conn.execute("UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 minute'")

    before = dt.datetime.now(dt.UTC)
    result = invoke_handler(ENQUEUE_EMAILS)  # reclaims one (the limit), runs it; the other is due
    after = dt.datetime.now(dt.UTC)

    assert (result["result"]["reclaimed"], result["result"]["done"]) == (1, 1)
    # After the run began, at the next step (a minute): never in the past. Compared with the
    # moments around the run, not with the clock when the test reads it (a minute may turn).
    wake_at = dt.datetime.fromisoformat(result["wake_at"])
    assert before < wake_at <= _latest_next_step(after)
    assert result["wake"] == "created"


def test_at_the_hop_limit_with_work_left_a_wake_up_starts_a_new_chain(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No continuation past PGDRAIN_MAX_CHAIN: the work left is picked up at the next step by a
    wake-up (a schedule is not a Lambda hop), not by the hourly safety net."""
    _handler_env(
        monkeypatch,
        db_url,
        PGDRAIN_RESERVE_SECONDS="4",
        PGDRAIN_MAX_RUNS="1",
        PGDRAIN_MAX_CHAIN="0",
        PGDRAIN_CONCURRENCY="1",
    )
    with conn.transaction():
        for _ in range(2):
            enqueue(conn, "sleep", {"seconds": 2.5}, queue="emails")

    before = dt.datetime.now(dt.UTC)
    result = invoke_handler(ENQUEUE_EMAILS, remaining_s=6.0)
    after = dt.datetime.now(dt.UTC)

    assert result["result"]["stop_reason"] == "budget", result
    assert (result["result"]["more_ready"], result["continued"]) == (True, False)
    wake_at = dt.datetime.fromisoformat(result["wake_at"])
    assert before < wake_at <= _latest_next_step(after)
    assert result["wake"] == "created"
    (schedule,) = _schedules(scheduler)
    assert json.loads(schedule["Target"]["Input"]) == events.wake_event(["default", "emails"])


@pytest.mark.parametrize("rated", [True, False], ids=["rate", "control-no-rate"])
def test_a_rate_limited_queue_wakes_the_function_at_the_next_window(
    db_url: str, conn: Conn, scheduler: Any, monkeypatch: pytest.MonkeyPatch, rated: bool
) -> None:
    """PGDRAIN_QUEUE_LIMITS="emails=2/1m": the kicked run starts 2 jobs, ends with 3 ready,
    and the one-shot schedule fires at the next minute, the window's start, not before."""
    limits = {"PGDRAIN_QUEUE_LIMITS": "emails=2/1m"} if rated else {}
    _handler_env(monkeypatch, db_url, **limits)
    with conn.transaction():
        for _ in range(5):
            enqueue(conn, "noop", {}, queue="emails")
    before = _next_window(conn)
    result = invoke_handler(ENQUEUE_EMAILS)
    # The same, unless a minute began during the run; and the one after, when the run ended
    # within a second of a minute's start: a schedule is made for at least a second ahead
    # (Waker.ensure), which rounds up to the next minute then.
    windows = {before, _next_window(conn), _next_window(conn, lead_s=1.0)}

    assert result["ok"] is True, result
    if rated:
        assert result["result"]["done"] in (2, 4)  # 4 only if a minute began during the run
        assert result["wake"] == "created"
        wake_at = dt.datetime.fromisoformat(result["wake_at"])
        assert wake_at in windows
        (schedule,) = _schedules(scheduler)
        assert schedule["ScheduleExpression"] == at_expression(wake_at)
    else:
        assert result["result"]["done"] == 5
        assert (result["wake"], _schedules(scheduler)) == ("none", [])


def _next_window(conn: Conn, lead_s: float = 0.0) -> dt.datetime:
    """The start of the minute after the one `lead_s` seconds from now (the database's clock)."""
    row = conn.execute(
        "SELECT date_trunc('minute', now() + %s * interval '1 second') + interval '1 minute'",
        (lead_s,),
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("restored", [True, False], ids=["put-back", "control-dropped"])
def test_a_wake_up_whose_request_failed_puts_back_the_later_one_it_replaced(
    conn: Conn, restored: bool
) -> None:
    """A red team's report: kick 1 reserved a wake-up 10 minutes out and sent its request; kick
    2 reserved an earlier one in its place, and its request failed (throttled): it dropped its
    row, kick 1's request was refused, and neither job had a wake-up until the safety net. The
    failed reservation now puts back the one it replaced. The control drops it, as before."""
    now = dt.datetime.now(dt.UTC)
    later, sooner = now + dt.timedelta(minutes=10), now + dt.timedelta(minutes=3)
    assert store.wake_reserve(conn, "emails", later, "kick:1", 30) is not None
    second = store.wake_reserve(conn, "emails", sooner, "kick:2", 30)
    assert second is not None and second.replaced is not None
    assert (second.replaced.wake_at, second.replaced.reserved_by) == (later, "kick:1")
    store.wake_release(conn, "emails", sooner, "kick:2", second.replaced if restored else None)
    store.wake_release(conn, "emails", sooner, "kick:2", second.replaced)  # sent again: no-op
    assert store.wake_confirm(conn, "emails", later, "kick:1", 3600) is restored
