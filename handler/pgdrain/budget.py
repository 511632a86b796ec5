"""The time budget of one run: how many seconds remain before the function is killed."""

from __future__ import annotations

import time
from collections.abc import Callable

# Stop waiting for running jobs this long before the deadline, so the run can still answer.
FINAL_MARGIN_SECONDS = 0.5


class Budget:
    """Remaining seconds, from an injected source: a monotonic clock, or (pgdrain.aws.context)
    the Lambda context.

    Only durations leave this object (never timestamps): the database turns them into lease
    expiries on its own clock, which may disagree with the function's."""

    def __init__(self, remaining: Callable[[], float]) -> None:
        self._remaining = remaining

    @classmethod
    def seconds(cls, total: float, clock: Callable[[], float] = time.monotonic) -> Budget:
        deadline = clock() + total
        return cls(lambda: deadline - clock())

    def remaining(self) -> float:
        return max(0.0, self._remaining())

    def exhausted(self, reserve: float) -> bool:
        """True when less than `reserve` seconds remain: time to stop starting work."""
        return self.remaining() < reserve
