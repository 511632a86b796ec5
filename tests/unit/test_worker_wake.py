"""Pure parts of `pgdrain worker` and of the kick that reaches it: where a kick goes
(api/kick_target.py), what a NOTIFY's payload names, and when an idle worker wakes by itself
(the earliest of the next due job, the next periodic slot and the safety net, never sooner
than MIN_WAIT_SECONDS)."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from pgdrain import Registry, Settings
from pgdrain.api.kick_target import (
    MAX_PAYLOAD_BYTES,
    kick_target,
    kicked_queues,
    notify_payload,
)
from pgdrain.db.store import ExitCheck
from pgdrain.errors import ConfigError
from pgdrain.runner.stop import StopRequest
from pgdrain.runner.worker import (
    DEFAULT_SAFETY_NET_SECONDS,
    MAX_UNSERVED_SAID,
    MIN_WAIT_SECONDS,
    Listener,
    Worker,
)

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, 500000, tzinfo=dt.UTC)
LAMBDA_ENV = {"AWS_LAMBDA_FUNCTION_NAME": "app-api"}
ECS_ENV = {"AWS_EXECUTION_ENV": "AWS_ECS_FARGATE"}


@pytest.mark.parametrize(
    ("settings", "env", "target"),
    [
        (Settings(function_name="stack-drain"), {}, "lambda"),
        (Settings(function_name="stack-drain"), LAMBDA_ENV, "lambda"),
        (Settings(), {}, "worker"),  # a laptop: `pgdrain worker` drains
        (Settings(kick="worker"), ECS_ENV, "worker"),  # a worker in a container, said so
        (Settings(kick="off"), LAMBDA_ENV, "off"),  # the drain function's own setting
        (Settings(kick="worker", function_name="stack-drain"), {}, "worker"),
    ],
)
def test_where_a_kick_goes(settings: Settings, env: dict[str, str], target: str) -> None:
    assert kick_target(settings, env) == target


@pytest.mark.parametrize("env", [LAMBDA_ENV, ECS_ENV], ids=["lambda", "ecs"])
def test_deployed_without_a_function_name_a_kick_is_an_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"set it to the drain function's name"):
        kick_target(Settings(), env)


def test_a_notify_names_the_kicked_queues_or_every_queue() -> None:
    assert notify_payload(["emails", "sms"]) == "emails,sms"
    assert kicked_queues("emails,sms") == frozenset({"emails", "sms"})
    assert kicked_queues("") is None  # `NOTIFY pgdrain_kick` from any client: every queue
    many = [f"q{i:060d}" for i in range(200)]  # past NOTIFY's 8000 bytes
    assert notify_payload(many) == "" and len(",".join(many)) > MAX_PAYLOAD_BYTES


def _worker(registry: Registry | None = None, rate: float | None = None) -> Worker:
    settings = Settings(schedule_rate_seconds=rate)
    return Worker(settings, registry or Registry(), "dbname=unused", stop=StopRequest())


def test_an_idle_worker_with_nothing_due_wakes_for_the_safety_net() -> None:
    assert _worker().next_wake(NOW) == (DEFAULT_SAFETY_NET_SECONDS, "safety net")
    assert _worker(rate=1800).next_wake(NOW) == (1800, "safety net")  # PGDRAIN_SCHEDULE_RATE


def test_it_wakes_at_the_earliest_of_due_work_and_periodic_slots() -> None:
    registry = Registry()

    @registry.periodic("*/5 * * * *", kind="report")
    def report(job: object) -> None:
        pass

    worker = _worker(registry)
    worker.next_due.periodics.at = NOW  # its last drain enqueued the slots due then
    assert worker.next_wake(NOW) == (299.5, "periodic")  # 12:05
    worker.next_due.due_at = NOW + dt.timedelta(seconds=42)
    assert worker.next_wake(NOW) == (42.0, "due")


def test_a_due_moment_already_passed_waits_a_little_not_zero() -> None:
    """The worker's clock ahead of the database's: the job is not ready yet when it looks."""
    worker = _worker()
    worker.next_due.due_at = NOW - dt.timedelta(seconds=3)
    assert worker.next_wake(NOW) == (MIN_WAIT_SECONDS, "due")


@pytest.mark.parametrize(
    "kept", [True, False], ids=["kept-while-referenced", "control-closed-at-shut"]
)
def test_a_wake_taken_before_the_shut_and_called_after_it_writes_to_no_other_file(
    kept: bool,
) -> None:
    """A stop request on another thread copies the wakers, then calls them; meanwhile the worker
    sees the stop and shuts its listener. Was: the shut closed the wake pipe at once, and the
    wake then failed with EBADF (seen in CI), or wrote into a file the numbers went to. The
    same timeline, in one thread: the pipe stays open while the wake can still be called."""
    stop = StopRequest()
    listener = Listener("", Settings(), stop, listen=False, queues=None, signals_wake=False)
    [wake] = stop._wakers  # as request() copies them, before the shut
    if not kept:  # as before: the pipe closed by shut()
        listener._pipe_closer.detach()
        os.close(listener._wake_r)
        os.close(listener._wake_w)
    listener.shut()
    assert stop._wakers == []
    # A file opened meanwhile takes the lowest free numbers: the pipe's, if they were freed.
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(read_end, False)
        wake()
        if kept:  # into the listener's own pipe, still open
            with pytest.raises(BlockingIOError):
                os.read(read_end, 1)
        else:  # into the new file
            assert os.read(read_end, 1) == b"\0"
    finally:
        os.close(read_end)
        os.close(write_end)
    # Once nothing refers to the listener (nor the wake taken from it), its pipe is closed.
    numbers = (listener._wake_r, listener._wake_w)
    del wake, listener
    if kept:
        for number in numbers:
            with pytest.raises(OSError):
                os.fstat(number)


class _ExitSession:
    """A Session's run() as NextDue.before_exit calls it: the exit check's answer."""

    def __init__(self, check: ExitCheck) -> None:
        self.check = check

    def run(self, operation: object, *args: object, **kwargs: object) -> ExitCheck:
        return self.check


@pytest.mark.parametrize("skew_s", [-20.0, 0.0, 8.0])
def test_an_idle_worker_waits_as_long_as_the_database_says_whatever_its_own_clock(
    skew_s: float,
) -> None:
    """A red team's finding: the worker took the database's due moment and waited until its own
    clock reached it, so a host clock 20 s behind started the job 20 s late, and one 8 s ahead
    drained empty twice a second until then. It now waits for as long as the database counts
    from its check (due_in_s) to that moment."""
    worker = _worker()
    database_now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=skew_s)
    check = ExitCheck(
        kicked=False,
        ready=False,
        due_at=database_now + dt.timedelta(seconds=42),
        due_in_s=42.0,
    )
    worker.next_due.before_exit(_ExitSession(check))  # type: ignore[arg-type]
    wait_s, reason = worker.next_wake(dt.datetime.now(dt.UTC))
    assert reason == "due" and 41.0 <= wait_s <= 42.0


def test_kicks_for_queues_it_does_not_serve_are_said_within_a_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A review's report: any client may NOTIFY, and each made-up queue name was said and kept,
    without end (2 MB of log from 300 NOTIFYs). Said once each, up to MAX_UNSERVED_SAID in all,
    names no queue can have never."""
    settings = Settings(queues=("a",))
    listener = Listener(
        "", settings, StopRequest(), listen=False, queues=("a",), signals_wake=False
    )
    try:
        with caplog.at_level("WARNING", logger="pgdrain.runner.worker"):
            listener._say_unserved(frozenset({"emails", "a b\x1b[2J"}))
            listener._say_unserved(frozenset({"emails"}))  # said already
            listener._say_unserved(frozenset(f"q{n:03}" for n in range(500)))
            listener._say_unserved(frozenset({"later"}))  # past the bound
    finally:
        listener.shut()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("kicked for emails, which this worker does not serve (a)")
    said = lines[1].removeprefix("kicked for ").split(", which")[0].split(", ")
    assert len(said) == MAX_UNSERVED_SAID - 1 and lines[1].endswith("are not said")
