"""The Lambda context, as pgdrain reads it: who is running, and how much time is left; and the
one made for a handler run outside Lambda."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Protocol

from pgdrain.budget import Budget


class LambdaContextLike(Protocol):
    @property
    def function_name(self) -> str: ...
    @property
    def aws_request_id(self) -> str: ...
    @property
    def invoked_function_arn(self) -> str: ...
    def get_remaining_time_in_millis(self) -> int: ...


def budget_from_context(context: LambdaContextLike) -> Budget:
    """The run's budget: the context's remaining time, read afresh on every call."""
    return Budget(lambda: context.get_remaining_time_in_millis() / 1000.0)


class FakeContext:
    """A Lambda context for a handler run outside Lambda (`pgdrain invoke`, the simulator, the
    benchmarks, the tests): its remaining time counts down from `remaining_s` on `clock`, and
    it has the attributes the handler and Powertools read, named as Lambda names them."""

    def __init__(
        self,
        remaining_s: float,
        function_arn: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        request_id: str | None = None,
        memory_mb: int = 512,
        log_stream: str = "local",
    ) -> None:
        self.function_name = function_arn.rsplit(":", 1)[-1]
        self.function_version = "$LATEST"
        self.invoked_function_arn = function_arn
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = log_stream
        self._clock = clock
        self._deadline = clock() + remaining_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock()) * 1000))
