"""The simulator's stand-in speaks the wire protocols botocore uses: these drive it with real boto3
clients (no database, no function processes: a recording environment stands in for them)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from sim.launcher import Outcome
from sim.standin import ControlPlane, Faults, PlaneConfig
from sim.timescale import Scale

FUNCTION = "sim-drain"
ARN = f"arn:aws:lambda:us-east-1:123456789012:function:{FUNCTION}"
ROLE = "arn:aws:iam::123456789012:role/scheduler"
FACTOR = 600.0  # a simulated minute is 0.1 real seconds: retries and schedules come quickly
WAIT_S = 10.0  # an upper bound for something expected, never a measured duration


class RecordingEnvironment:
    env_id = "recording-1"
    alive = True

    def __init__(self, pool: RecordingPool) -> None:
        self.pool = pool

    def invoke(self, message: dict[str, Any], deadline: float) -> Outcome:
        with self.pool.lock:
            self.pool.events.append(message["event"])
            self.pool.changed.notify_all()
        self.pool.release_gate.wait(WAIT_S)
        return Outcome(self.pool.status, None, time.time())


class RecordingPool:
    def __init__(self, status: str = "ok") -> None:
        self.status = status
        self.events: list[Any] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.release_gate = threading.Event()
        self.release_gate.set()

    def acquire(self) -> RecordingEnvironment:
        return RecordingEnvironment(self)

    def release(self, environment: RecordingEnvironment) -> None:
        pass

    def close(self) -> None:
        self.release_gate.set()

    def wait_for(self, count: int) -> list[Any]:
        with self.lock:
            assert self.changed.wait_for(lambda: len(self.events) >= count, WAIT_S), self.events
            return list(self.events)


@contextlib.contextmanager
def _plane(pool: RecordingPool, **overrides: Any) -> Iterator[ControlPlane]:
    settings: dict[str, Any] = {
        "function_name": FUNCTION,
        "function_arn": ARN,
        "timeout_s": 300.0,
        "concurrency": 2,
        "max_retry_attempts": 0,
        "max_event_age_s": 900.0,
        "rate_s": None,
    }
    plane = ControlPlane(PlaneConfig(**(settings | overrides)), Scale(FACTOR), pool)  # type: ignore[arg-type]
    plane.start(Scale(FACTOR, time.time()))
    try:
        yield plane
    finally:
        plane.stop()


def _client(service: Literal["lambda", "scheduler"], plane: ControlPlane) -> Any:
    return boto3.client(
        service,
        endpoint_url=plane.url,
        region_name="us-east-1",
        aws_access_key_id="sim",
        aws_secret_access_key="sim",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


@pytest.fixture
def pool() -> RecordingPool:
    return RecordingPool()


@pytest.fixture
def plane(pool: RecordingPool) -> Iterator[ControlPlane]:
    with _plane(pool) as plane:
        yield plane


def _at(seconds_from_now: float) -> str:
    moment = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now)
    return f"at({moment.strftime('%Y-%m-%dT%H:%M:%S')})"


def test_an_async_invoke_is_accepted_and_runs_the_event(
    plane: ControlPlane, pool: RecordingPool
) -> None:
    response = _client("lambda", plane).invoke(
        FunctionName=ARN, InvocationType="Event", Payload=b'{"pgdrain": {"reason": "enqueue"}}'
    )
    assert response["StatusCode"] == 202
    assert pool.wait_for(1) == [{"pgdrain": {"reason": "enqueue"}}]


def test_a_sync_invoke_beyond_the_cap_is_throttled(pool: RecordingPool) -> None:
    with _plane(pool, concurrency=0) as plane:
        with pytest.raises(ClientError) as caught:
            _client("lambda", plane).invoke(FunctionName=FUNCTION, Payload=b"{}")
        assert caught.value.response["Error"]["Code"] == "TooManyRequestsException"


def test_a_throttled_async_event_runs_once_a_slot_frees(pool: RecordingPool) -> None:
    pool.release_gate.clear()  # the first run holds the only slot
    with _plane(pool, concurrency=1) as plane:
        client = _client("lambda", plane)
        client.invoke(FunctionName=FUNCTION, InvocationType="Event", Payload=b'{"n": 1}')
        pool.wait_for(1)
        client.invoke(FunctionName=FUNCTION, InvocationType="Event", Payload=b'{"n": 2}')
        pool.release_gate.set()
        assert pool.wait_for(2) == [{"n": 1}, {"n": 2}]
        assert plane.counters.throttled >= 1


def test_an_injected_invoke_failure_is_a_500(pool: RecordingPool) -> None:
    with _plane(pool, faults=Faults(invoke_fail=((0.0, 1e9),))) as plane:
        with pytest.raises(ClientError) as caught:
            _client("lambda", plane).invoke(FunctionName=FUNCTION, InvocationType="Event")
        assert caught.value.response["Error"]["Code"] == "ServiceException"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500


def test_an_injected_invoke_throttle_is_a_429(pool: RecordingPool) -> None:
    with _plane(pool, faults=Faults(invoke_throttle=((0.0, 1e9),))) as plane:
        with pytest.raises(ClientError) as caught:
            _client("lambda", plane).invoke(FunctionName=FUNCTION, InvocationType="Event")
        assert caught.value.response["Error"]["Code"] == "TooManyRequestsException"
        assert pool.events == []


def test_a_failed_run_is_retried_as_the_retry_policy_says() -> None:
    failing = RecordingPool(status="error")
    with _plane(failing, max_retry_attempts=2) as plane:
        _client("lambda", plane).invoke(FunctionName=FUNCTION, InvocationType="Event")
        assert len(failing.wait_for(3)) == 3  # the event, then two retries
        assert plane.counters.retries == 2


def test_duplicate_delivery_on_request(pool: RecordingPool) -> None:
    with _plane(pool, faults=Faults(duplicate_every=1)) as plane:
        _client("lambda", plane).invoke(FunctionName=FUNCTION, InvocationType="Event")
        assert len(pool.wait_for(2)) == 2


def test_every_fanout_event_delivered_twice_on_request(pool: RecordingPool) -> None:
    fanout = {"pgdrain": {"reason": "fanout", "queues": ["default"], "chain": 1, "run": "r1"}}
    kick = {"pgdrain": {"reason": "enqueue", "queues": ["default"]}}
    with _plane(pool, faults=Faults(duplicate_fanout=True)) as plane:
        client = _client("lambda", plane)
        client.invoke(FunctionName=FUNCTION, InvocationType="Event", Payload=json.dumps(kick))
        client.invoke(FunctionName=FUNCTION, InvocationType="Event", Payload=json.dumps(fanout))
        events = pool.wait_for(3)
        assert sorted(e["pgdrain"]["reason"] for e in events) == ["enqueue", "fanout", "fanout"]
        assert plane.counters.duplicates == 1


def test_one_shot_schedule_create_conflict_get_delete(plane: ControlPlane) -> None:
    scheduler = _client("scheduler", plane)
    request = {
        "Name": "pgdrain-wake-1",
        "GroupName": "pgdrain",
        "ScheduleExpression": _at(3600),
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "ActionAfterCompletion": "DELETE",
        "Target": {"Arn": ARN, "RoleArn": ROLE, "Input": json.dumps({"pgdrain": {}})},
    }
    assert scheduler.create_schedule(**request)["ScheduleArn"].endswith(
        ":schedule/pgdrain/pgdrain-wake-1"
    )
    with pytest.raises(scheduler.exceptions.ConflictException):
        scheduler.create_schedule(**request)
    got = scheduler.get_schedule(Name="pgdrain-wake-1", GroupName="pgdrain")
    assert got["ActionAfterCompletion"] == "DELETE"
    scheduler.delete_schedule(Name="pgdrain-wake-1", GroupName="pgdrain")
    with pytest.raises(scheduler.exceptions.ResourceNotFoundException):
        scheduler.delete_schedule(Name="pgdrain-wake-1", GroupName="pgdrain")


def test_a_one_shot_schedule_fires_its_input_and_is_deleted(
    plane: ControlPlane, pool: RecordingPool
) -> None:
    scheduler = _client("scheduler", plane)
    wake = {"pgdrain": {"reason": "wake", "queues": ["default"]}}
    scheduler.create_schedule(
        Name="soon",
        GroupName="pgdrain",
        ScheduleExpression=_at(1),
        FlexibleTimeWindow={"Mode": "OFF"},
        ActionAfterCompletion="DELETE",
        Target={"Arn": ARN, "RoleArn": ROLE, "Input": json.dumps(wake)},
    )
    assert pool.wait_for(1) == [wake]
    with pytest.raises(scheduler.exceptions.ResourceNotFoundException):
        scheduler.get_schedule(Name="soon", GroupName="pgdrain")


def test_an_update_moves_a_schedule_and_its_old_time_no_longer_fires(
    plane: ControlPlane, pool: RecordingPool
) -> None:
    scheduler = _client("scheduler", plane)
    safety = {"pgdrain": {"reason": "safety"}}
    request = {
        "Name": "pgdrain-safety-net",
        "GroupName": "pgdrain",
        "ScheduleExpression": _at(1),
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "ActionAfterCompletion": "DELETE",
        "Target": {"Arn": ARN, "RoleArn": ROLE, "Input": json.dumps(safety)},
    }
    with pytest.raises(scheduler.exceptions.ResourceNotFoundException):
        scheduler.update_schedule(**request)  # nothing to update yet
    scheduler.create_schedule(**request)
    later = _at(3600)
    scheduler.update_schedule(**(request | {"ScheduleExpression": later}))

    marker = {"pgdrain": {"reason": "wake", "queues": ["default"]}}
    scheduler.create_schedule(  # a second after the old time: once it fires, that time passed
        **(request | {"Name": "marker", "ScheduleExpression": _at(2)})
        | {"Target": {"Arn": ARN, "RoleArn": ROLE, "Input": json.dumps(marker)}}
    )

    got = scheduler.get_schedule(Name="pgdrain-safety-net", GroupName="pgdrain")
    assert got["ScheduleExpression"] == later
    assert pool.wait_for(1) == [marker]  # and not the safety net's old time before it
    assert plane.counters.schedules_updated == 1


def test_an_injected_create_schedule_failure_is_a_500(pool: RecordingPool) -> None:
    with _plane(pool, faults=Faults(create_schedule_fail=((0.0, 1e9),))) as plane:
        scheduler = _client("scheduler", plane)
        with pytest.raises(scheduler.exceptions.InternalServerException):
            scheduler.create_schedule(
                Name="x",
                ScheduleExpression=_at(60),
                FlexibleTimeWindow={"Mode": "OFF"},
                Target={"Arn": ARN, "RoleArn": ROLE},
            )


def test_the_rate_schedule_sends_a_scheduler_event(pool: RecordingPool) -> None:
    with _plane(pool, rate_s=60.0):
        event = pool.wait_for(1)[0]
        assert event["source"] == "aws.scheduler"
        assert event["detail-type"] == "Scheduled Event"
