"""Running one job: find the function registered for its kind and call it with a Job, in a
worker thread, inside the registry's middleware. An `async def` job runs on the worker
thread's event loop. Nothing here touches the database: the outcome goes back to the run's
main thread, which records it; a failure is decided here (outcomes.decide, with the kind's
backoff) and raised as outcomes.AttemptFailed."""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from contextlib import ExitStack
from typing import Any

from pgdrain.api import outcomes, retry
from pgdrain.api.registry import Job, Registered, Registry
from pgdrain.db.store import ClaimedJob
from pgdrain.runner import worker_threads


class JobTimeout(Exception):
    """The job ran past its kind's timeout: its result is not accepted."""


class NotAwaited(TypeError):
    """A job function that is not `async def` returned an awaitable: it never ran."""


def run_job(
    registry: Registry,
    claimed: ClaimedJob,
    remaining: Callable[[], float],
    lost_tokens: Collection[uuid.UUID],
) -> None:
    try:
        registered = registry.registered(claimed.kind)
    except BaseException as exc:  # an unknown kind: the same mechanism as any failure
        raise outcomes.AttemptFailed(
            outcomes.decide(exc, claimed.attempt, retry.backoff_seconds)
        ) from exc
    try:
        _call(registry, registered, claimed, remaining, lost_tokens)
    except BaseException as exc:  # the job's own error, whatever it is, becomes its outcome
        decision = outcomes.decide(exc, claimed.attempt, registry.backoff_for(claimed.kind))
        raise outcomes.AttemptFailed(decision) from exc


def _call(
    registry: Registry,
    registered: Registered,
    claimed: ClaimedJob,
    remaining: Callable[[], float],
    lost_tokens: Collection[uuid.UUID],
) -> None:
    timeout = registered.options.timeout
    started = 0.0
    if timeout is not None:
        started = time.monotonic()
        ends = started + timeout
        budget_left = remaining

        def remaining() -> float:
            return min(budget_left(), ends - time.monotonic())

    job = Job(
        id=claimed.id,
        kind=claimed.kind,
        queue=claimed.queue,
        payload=claimed.payload,
        attempt=claimed.attempt,
        max_attempts=claimed.max_attempts,
        attempt_token=claimed.attempt_token,
        _remaining=remaining,
        _lost_tokens=lost_tokens,
    )
    middlewares = registry.middlewares
    if middlewares:
        with ExitStack() as stack:
            for middleware in middlewares:
                stack.enter_context(middleware(job))
            _invoke(registered, job, timeout)
    else:  # the common case: no ExitStack per job
        _invoke(registered, job, timeout)
    if timeout is not None and (elapsed := time.monotonic() - started) > timeout:
        # A late result is not accepted: the attempt fails (and is retried) as a timeout.
        raise JobTimeout(
            f"job kind {claimed.kind!r} ran {elapsed:.1f} s, over its timeout of {timeout:g} s"
        )


def _invoke(registered: Registered, job: Job, timeout: float | None) -> None:
    if registered.is_async:
        _run_async(registered.function(job), timeout)
        return
    result = registered.function(job)
    if result is not None and inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never started: close it, so no "never awaited" warning
        raise NotAwaited(
            f"the function for job kind {job.kind!r} returned an awaitable "
            "instead of running: declare it `async def`, or await it inside"
        )


def _run_async(awaitable: object, timeout: float | None) -> None:
    async def bounded() -> Any:
        # An async job is cancelled at its timeout (a sync one can only be judged late).
        async with asyncio.timeout(timeout):
            return await _as_awaitable(awaitable)

    loop = worker_threads.thread_loop()
    try:
        if loop is None:  # not on a worker thread (called directly): a loop of its own
            asyncio.run(bounded())
        else:
            loop.run_until_complete(bounded())
    except TimeoutError:
        raise JobTimeout(f"async job cancelled at its timeout of {timeout:g} s") from None


def _as_awaitable(value: object) -> Awaitable[Any]:
    if not inspect.isawaitable(value):
        raise TypeError("an async job function returned no awaitable")
    return value
