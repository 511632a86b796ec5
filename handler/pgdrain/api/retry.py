"""Retry policy: pure functions of the attempt number, unit-tested without a database."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

BASE_DELAY_SECONDS = 10.0
MAX_DELAY_SECONDS = 3600.0
JITTER_FRACTION = 0.25


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff between a failed attempt and the next: base, cap and jitter."""

    base_seconds: float = BASE_DELAY_SECONDS
    cap_seconds: float = MAX_DELAY_SECONDS
    jitter: float = JITTER_FRACTION

    def __post_init__(self) -> None:
        # NaN passes every comparison below as False: a NaN cap made every delay 0.
        if not all(math.isfinite(v) for v in (self.base_seconds, self.cap_seconds, self.jitter)):
            raise ValueError("base_seconds, cap_seconds and jitter must be finite numbers")
        if self.base_seconds < 0:
            raise ValueError("base_seconds must not be negative")
        if self.cap_seconds < self.base_seconds:
            raise ValueError("cap_seconds must be at least base_seconds")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")


def backoff_seconds(
    attempt: int,
    policy: RetryPolicy = RetryPolicy(),
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before the attempt after `attempt` (1-based): base * 2^(attempt-1), capped, then
    spread by up to ±jitter so that jobs failing together do not come back together.
    The result never exceeds the cap."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    exponent = min(attempt - 1, 62)  # 2**62 already dwarfs any cap
    raw = min(policy.cap_seconds, policy.base_seconds * 2.0**exponent)
    spread = raw * policy.jitter * (2.0 * rand() - 1.0)
    return max(0.0, min(policy.cap_seconds, raw + spread))
