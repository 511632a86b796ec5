"""Running one job: find the function registered for its kind and call it with a Job, in a
worker thread. Nothing here touches the database: the outcome (a return or an exception) goes
back to the run's main thread, which records it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection

from pgdrain.registry import Job, Registry
from pgdrain.store import ClaimedJob


def run_job(
    registry: Registry,
    claimed: ClaimedJob,
    remaining: Callable[[], float],
    lost_tokens: Collection[uuid.UUID],
) -> None:
    function = registry.function_for(claimed.kind)
    function(
        Job(
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
    )
