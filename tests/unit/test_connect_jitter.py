"""Simultaneous triggers on a database that is still waking (Neon's proxy refuses connections
beyond a quota while a compute starts) must not retry in lockstep: db.connect backs off with
jitter. Two runs refused at the same moments wait different times; the control (no jitter)
waits the same times, so every retry collides again."""

from __future__ import annotations

import random
import socket

import pytest

from pgdrain import Budget, Settings
from pgdrain.db import FIRST_RETRY_DELAY_SECONDS, connect, equal_jitter
from pgdrain.errors import DatabaseUnavailable


def _refusing_url() -> str:
    with socket.socket() as s:  # a port nothing listens on: every attempt is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://nobody@127.0.0.1:{port}/none"


def _waits(url: str, seed: int, jittered: bool) -> list[float]:
    waits: list[float] = []
    rng = random.Random(seed)

    def jitter(delay: float) -> float:
        return delay / 2 + rng.uniform(0, delay / 2) if jittered else delay

    settings = Settings(reserve_seconds=0, connect_timeout=2)
    with pytest.raises(DatabaseUnavailable):
        connect(url, settings, Budget(lambda: 2.0), sleep=waits.append, jitter=jitter)
    return waits


@pytest.mark.parametrize("jittered", [True, False], ids=["jitter", "control-no-jitter"])
def test_two_runs_refused_together_retry_apart(jittered: bool) -> None:
    url = _refusing_url()
    first, second = _waits(url, 1, jittered), _waits(url, 2, jittered)
    assert len(first) == len(second) >= 2
    if jittered:
        assert all(a != b for a, b in zip(first, second, strict=True))
    else:
        assert first == second  # lockstep: they collide at every retry


def test_equal_jitter_stays_within_half_and_all_of_the_delay() -> None:
    for _ in range(100):
        assert FIRST_RETRY_DELAY_SECONDS / 2 <= equal_jitter(FIRST_RETRY_DELAY_SECONDS)
        assert equal_jitter(FIRST_RETRY_DELAY_SECONDS) <= FIRST_RETRY_DELAY_SECONDS
