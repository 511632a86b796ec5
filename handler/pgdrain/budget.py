"""The time budget of one run: how many seconds remain before the function is killed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class LambdaContextLike(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


class Budget:
    """Remaining seconds, from an injected source: the Lambda context, or a monotonic clock.

    Only durations leave this object (never timestamps): the database turns them into lease
    expiries on its own clock, which may disagree with the function's."""

    def __init__(self, remaining: Callable[[], float]) -> None:
        self._remaining = remaining

    @classmethod
    def seconds(cls, total: float, clock: Callable[[], float] = time.monotonic) -> Budget:
        deadline = clock() + total
        return cls(lambda: deadline - clock())

    @classmethod
    def from_lambda_context(cls, context: LambdaContextLike) -> Budget:
        return cls(lambda: context.get_remaining_time_in_millis() / 1000.0)

    def remaining(self) -> float:
        return max(0.0, self._remaining())

    def exhausted(self, reserve: float) -> bool:
        """True when less than `reserve` seconds remain: time to stop starting work."""
        return self.remaining() < reserve
