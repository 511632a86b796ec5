"""Running one job: find the function registered for its kind and call it with a Job, in a
worker thread, inside the registry's middleware. An `async def` job runs on the worker
thread's event loop. Nothing here touches the database: the outcome goes back to the run's
main thread, which records it; a failure is decided here (outcomes.decide, with the kind's
backoff) and raised as outcomes.AttemptFailed."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from contextlib import ExitStack
from typing import Any, NamedTuple

from pgdrain.api import outcomes
from pgdrain.api.registry import (
    MAX_OUTPUT_BYTES,
    Job,
    Registered,
    Registry,
    bounded_json,
)
from pgdrain.db.store import ClaimedJob, Held
from pgdrain.errors import BadInput
from pgdrain.runner import worker_threads


class Recorded(NamedTuple):
    """What running attempts recorded and the run has not written yet, as JSON text: written
    by job threads, taken by the run's loop (dict operations are atomic)."""

    outputs: MutableMapping[Held, str]
    progress: MutableMapping[Held, str]


class JobTimeout(Exception):
    """The job ran past its kind's timeout: its result is not accepted."""


class NotAwaited(TypeError):
    """A job function that is not `async def` returned an awaitable: it never ran."""


def run_job(
    registry: Registry,
    claimed: ClaimedJob,
    remaining: Callable[[], float],
    lost_tokens: Collection[uuid.UUID],
    recorded: Recorded | None = None,
    lease_lapsed: Callable[[], bool] = lambda: False,
) -> None:
    """Run the job. What it returns (not None) is its output: put in `recorded.outputs` as
    JSON text for the run to write; an output that cannot be stored (over MAX_OUTPUT_BYTES,
    not JSON) fails the job for good, with that error."""
    try:
        registered = registry.registered(claimed.kind)
    except BaseException as exc:  # an unknown kind: retried, as deploy lag
        raise outcomes.AttemptFailed(outcomes.decide_unregistered(exc, claimed.attempt)) from exc
    try:
        progress = None if recorded is None else recorded.progress
        result = _call(
            registry, registered, claimed, remaining, lost_tokens, progress, lease_lapsed
        )
        if result is not None and recorded is not None:
            try:
                text = bounded_json(result, "output", MAX_OUTPUT_BYTES)
            except BadInput as exc:
                raise outcomes.Discard(f"its output was not recorded: {exc}") from None
            recorded.outputs[claimed.held] = text
    except BaseException as exc:  # the job's own error, whatever it is, becomes its outcome
        decision = outcomes.decide(exc, claimed.attempt, registry.backoff_for(claimed.kind))
        raise outcomes.AttemptFailed(decision) from exc


def _call(
    registry: Registry,
    registered: Registered,
    claimed: ClaimedJob,
    remaining: Callable[[], float],
    lost_tokens: Collection[uuid.UUID],
    progress: MutableMapping[Held, str] | None = None,
    lease_lapsed: Callable[[], bool] = lambda: False,
) -> object:
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
        _progress=progress,
        _lease_lapsed=lease_lapsed,
    )
    middlewares = registry.middlewares
    if middlewares:
        # None when a middleware suppresses what the job raised (its __exit__ returns true):
        # the attempt then ends as if the function had returned nothing, as in Python.
        result = None
        with ExitStack() as stack:
            for middleware in middlewares:
                stack.enter_context(middleware(job))
            result = _invoke(registered, job, timeout)
    else:  # the common case: no ExitStack per job
        result = _invoke(registered, job, timeout)
    if timeout is not None and (elapsed := time.monotonic() - started) > timeout:
        # A late result is not accepted: the attempt fails (and is retried) as a timeout.
        raise JobTimeout(
            f"job kind {claimed.kind!r} ran {elapsed:.1f} s, over its timeout of {timeout:g} s"
        )
    return result


def _invoke(registered: Registered, job: Job, timeout: float | None) -> object:
    if registered.is_async:
        return _run_async(registered.function(job), timeout)
    pid = os.getpid()
    try:
        result = registered.function(job)
    except BaseException as exc:
        worker_threads.end_if_forked(pid, exc)  # a child it forked: ends here, before anything
        raise
    worker_threads.end_if_forked(pid)
    if result is not None and inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never started: close it, so no "never awaited" warning
        raise NotAwaited(
            f"the function for job kind {job.kind!r} returned an awaitable "
            "instead of running: declare it `async def`, or await it inside"
        )
    return result


def _run_async(awaitable: object, timeout: float | None) -> object:
    expired = False

    async def bounded() -> Any:
        nonlocal expired
        # An async job is cancelled at its timeout (a sync one can only be judged late).
        async with asyncio.timeout(timeout) as scope:
            try:
                return await _as_awaitable(awaitable)
            finally:
                expired = scope.expired()

    loop = worker_threads.thread_loop()
    try:
        if loop is None:  # not on a worker thread (called directly): a loop of its own
            return asyncio.run(bounded())
        return loop.run_until_complete(bounded())
    except TimeoutError:
        if not expired:  # the job's own TimeoutError (a socket's, say): its failure, as it is
            raise
        raise JobTimeout(f"async job cancelled at its timeout of {timeout:g} s") from None


def _as_awaitable(value: object) -> Awaitable[Any]:
    if not inspect.isawaitable(value):
        raise TypeError("an async job function returned no awaitable")
    return value
