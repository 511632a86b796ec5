"""Running one job (runner/execute.py's run_job), without a database: the function registered for
its kind gets a Job made from the claimed row, an `async def` one runs to its end on an event
loop, and whatever a job raises comes back as AttemptFailed with its outcome decided."""

from __future__ import annotations

import asyncio
import contextlib
import os
import traceback
import uuid
from collections.abc import Iterator

import pytest

import pgdrain
from pgdrain import Discard, Job, Registry, RetryPolicy
from pgdrain.api.outcomes import AttemptFailed
from pgdrain.api.registry import Middleware
from pgdrain.db.store import ClaimedJob
from pgdrain.errors import UnknownJobKind
from pgdrain.runner.execute import JobTimeout, NotAwaited, run_job

RUN_AT_US = 1_767_225_600_000_000  # a claimed job's run_at (2026-01-01) in microseconds

TOKEN = uuid.uuid4()


def _claimed(kind: str, attempt: int = 2) -> ClaimedJob:
    return ClaimedJob(41, "emails", kind, '{"user_id": 42}', attempt, 5, TOKEN, 0, RUN_AT_US)


def _run(registry: Registry, kind: str, lost: set[uuid.UUID] | None = None) -> None:
    run_job(registry, _claimed(kind), lambda: 30.0, set() if lost is None else lost)


def test_a_sync_job_gets_the_claimed_row_as_its_job() -> None:
    registry = Registry()
    seen: list[Job] = []
    registry.job("send")(seen.append)

    _run(registry, "send")

    (job,) = seen
    assert (job.id, job.kind, job.queue, job.payload) == (41, "send", "emails", {"user_id": 42})
    assert (job.attempt, job.max_attempts, job.attempt_token) == (2, 5, TOKEN)
    assert job.remaining() == 30.0 and not job.lease_lost()


def test_an_async_job_runs_to_its_end_on_an_event_loop() -> None:
    """Called outside a worker thread, on a loop of its own."""
    registry = Registry()
    steps: list[str] = []

    @registry.job("send")
    async def send(job: Job) -> None:
        steps.append("started")
        await asyncio.sleep(0)  # gives the loop a turn: the job really is awaited
        steps.append(f"done {job.id}")

    _run(registry, "send")
    assert steps == ["started", "done 41"]


def test_a_job_sees_its_lease_lost_while_it_runs() -> None:
    registry = Registry()
    lost: set[uuid.UUID] = set()
    seen: list[bool] = []

    @registry.job("long")
    def long(job: Job) -> None:
        seen.append(job.lease_lost())
        lost.add(TOKEN)  # as the heartbeat does from the run's thread
        seen.append(job.lease_lost())

    _run(registry, "long", lost)
    assert seen == [False, True]


def test_an_exception_is_the_attempt_failing_with_the_kinds_backoff() -> None:
    registry = Registry()

    @registry.job("send", backoff=RetryPolicy(base_seconds=7, jitter=0))
    def send(job: Job) -> None:
        raise ValueError("no such user")

    with pytest.raises(AttemptFailed) as failed:
        _run(registry, "send")
    decision = failed.value.decision
    assert isinstance(failed.value.__cause__, ValueError)
    assert decision.message == "ValueError: no such user"
    assert decision.delay_seconds == 14.0  # attempt 2: twice the base
    assert not decision.final and decision.spend_attempt
    assert "raise ValueError" in decision.traceback


def test_an_outcome_the_job_raises_is_decided_as_it_says() -> None:
    registry = Registry()

    @registry.job("send")
    async def send(job: Job) -> None:
        raise Discard("the user is gone")

    with pytest.raises(AttemptFailed) as failed:
        _run(registry, "send")
    assert failed.value.decision.final
    assert failed.value.decision.message == "discarded: the user is gone"


def test_an_unknown_kind_fails_the_attempt_to_be_retried() -> None:
    """A deploy may not have reached every function that drains the queue yet."""
    with pytest.raises(AttemptFailed) as failed:
        _run(Registry(), "nobody_knows")
    assert isinstance(failed.value.__cause__, UnknownJobKind)
    assert not failed.value.decision.final and failed.value.decision.delay_seconds > 0


def test_an_unknown_kind_the_job_itself_names_is_its_own_failure() -> None:
    """A red team's report: a job enqueueing a typo'd kind was retried as deploy lag, its
    traceback dropped. Only the lookup of the claimed kind is deploy lag."""
    registry = Registry()

    @registry.job("signup")
    def signup(job: Job) -> None:
        registry.check_kind("send_emial")  # what registry.enqueue does first

    with pytest.raises(AttemptFailed) as failed:
        _run(registry, "signup")
    decision = failed.value.decision
    assert decision.message.startswith("UnknownJobKind: no function is registered for job kind")
    assert "deploy" not in decision.message
    assert 'registry.check_kind("send_emial")' in decision.traceback


def test_a_sync_function_returning_a_coroutine_never_ran_and_fails() -> None:
    registry = Registry()
    ran: list[int] = []

    async def work(job: Job) -> None:
        ran.append(job.id)

    registry.job("send")(lambda job: work(job))  # forgot to declare it async

    with pytest.raises(AttemptFailed) as failed:
        _run(registry, "send")
    assert isinstance(failed.value.__cause__, NotAwaited) and ran == []


def test_an_async_job_is_cancelled_at_its_kinds_timeout() -> None:
    registry = Registry()

    @registry.job("waits", timeout=0.01)
    async def waits(job: Job) -> None:
        assert job.remaining() <= 0.01  # the kind's timeout ends before the budget
        await asyncio.Event().wait()  # never set: only the timeout ends it

    with pytest.raises(AttemptFailed) as failed:
        _run(registry, "waits")
    assert isinstance(failed.value.__cause__, JobTimeout)


@pytest.mark.parametrize("timeout", [None, 5.0], ids=["no-timeout", "a-timeout-not-reached"])
def test_an_async_jobs_own_timeout_error_is_its_failure_not_the_kinds_timeout(
    timeout: float | None,
) -> None:
    """A red team's report: a socket's TimeoutError was taken for the kind's timeout (and,
    with none, failed on formatting None)."""
    registry = Registry()

    @registry.job("fetch", timeout=timeout)
    async def fetch(job: Job) -> None:
        raise TimeoutError("my own socket timed out")

    with pytest.raises(AttemptFailed) as failed:
        _run(registry, "fetch")
    assert type(failed.value.__cause__) is TimeoutError
    assert failed.value.decision.message == "TimeoutError: my own socket timed out"


def test_a_middleware_that_suppresses_the_error_ends_the_attempt_as_returning_nothing() -> None:
    """A red team's report: it failed the attempt with an UnboundLocalError."""
    registry = Registry()
    registry.middleware(lambda job: contextlib.suppress(ValueError))

    @registry.job("send")
    def send(job: Job) -> str:
        raise ValueError("swallowed")

    _run(registry, "send")  # no AttemptFailed: done, with no output


def test_middleware_wraps_the_job_outermost_first_and_sees_its_error() -> None:
    registry = Registry()
    calls: list[str] = []

    def named(name: str) -> Middleware:
        @contextlib.contextmanager
        def middleware(job: Job) -> Iterator[None]:
            calls.append(f"{name} enter {job.kind}")
            try:
                yield
            except ValueError:
                calls.append(f"{name} saw the error")
                raise

        return middleware

    registry.middleware(named("outer"))
    registry.middleware(named("inner"))

    @registry.job("send")
    def send(job: Job) -> None:
        calls.append("job")
        raise ValueError("boom")

    with pytest.raises(AttemptFailed):
        _run(registry, "send")
    assert calls == [
        "outer enter send",
        "inner enter send",
        "job",
        "inner saw the error",
        "outer saw the error",
    ]


def _lookup(user: dict[str, int], key: str) -> int:
    return user[key]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_failed_attempts_traceback_holds_the_jobs_frames_not_the_runs(is_async: bool) -> None:
    """What `jobs show` and the Lambda log keep: where the job failed. The run's own frames
    (execute.py calling the function, the event loop for an async job) say nothing about
    it; the control is the same exception formatted whole."""
    registry = Registry()
    if is_async:

        @registry.job("send")
        async def send_async(job: Job) -> None:
            _lookup({}, "user")

    else:

        @registry.job("send")
        def send(job: Job) -> None:
            _lookup({}, "user")

    with pytest.raises(AttemptFailed) as raised:
        _run(registry, "send")

    kept = raised.value.decision.traceback
    assert kept.startswith("Traceback (most recent call last):")
    assert "in send" in kept and "in _lookup" in kept and kept.endswith("KeyError: 'user'\n")
    package = os.path.dirname(pgdrain.__file__) + os.sep
    assert package not in kept, kept
    whole = "".join(traceback.format_exception(raised.value.__cause__))
    assert f"{package}runner{os.sep}execute.py" in whole  # the control
