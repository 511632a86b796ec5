"""The drain's bounds, without a database: how long a statement may take (session.py), how
long the leases a run holds still last, and how many jobs it claims at once (attempts.py)."""

from __future__ import annotations

import time
import uuid

import pytest

from pgdrain import Budget, Settings
from pgdrain.attempts import Attempts
from pgdrain.session import MIN_TIMEOUT_MS, Session
from pgdrain.store import ClaimedJob


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("left", "timeout_ms"),
    [
        (10.0, 9500),  # the budget less the final margin: time to end and answer
        (0.8, 500),  # inside the last second: never less than the margin while it lasts
        (0.3, 300),  # inside the final margin (the last flush): what is left
        (0.0, MIN_TIMEOUT_MS),  # never 0, which would mean no limit at all
    ],
)
def test_a_statement_may_take_the_budget_left_less_the_final_margin(
    left: float, timeout_ms: int
) -> None:
    clock = Clock()
    budget = Budget.seconds(left, clock=clock)
    session = Session("postgresql://unused", Settings(), budget)
    assert session.timeout_ms() == timeout_ms


def _claimed(job_id: int) -> ClaimedJob:
    return ClaimedJob(job_id, "default", "k", "{}", 1, 5, uuid.uuid4())


def test_the_oldest_lease_held_counts_from_its_last_renewal() -> None:
    attempts = Attempts()
    assert attempts.lease_seconds_left(30) is None  # nothing held
    claimed_at = time.monotonic()
    attempts.unstarted.append(_claimed(1))
    attempts.leases_claimed(claimed_at)
    attempts.leases_claimed(claimed_at + 5)  # a later claim does not make the first younger
    left = attempts.lease_seconds_left(30)
    assert left is not None and left <= 30
    attempts.leases_renewed(claimed_at + 20)  # a heartbeat extended them all
    renewed = attempts.lease_seconds_left(30)
    assert renewed is not None and renewed > left
    attempts.take_unstarted()
    assert attempts.lease_seconds_left(30) is None


@pytest.mark.parametrize(
    ("running", "wanted"),
    [
        (0, 4),  # every slot free
        (2, 2),  # half the slots free: refill
        (3, 0),  # one free slot is not worth a round trip while jobs run
        (4, 0),  # none free
    ],
)
def test_a_run_claims_what_free_slots_start_once_half_are_free(running: int, wanted: int) -> None:
    attempts = Attempts()
    for job_id in range(running):
        attempts.unstarted.append(_claimed(job_id))
        attempts.start_next()
    assert attempts.to_claim(concurrency=4, batch_size=10) == wanted


def test_claim_ahead_adds_the_slots_about_to_free_at_most_a_batch() -> None:
    attempts = Attempts()
    for job_id in range(4):
        attempts.unstarted.append(_claimed(job_id))
        attempts.start_next()
    assert attempts.to_claim(concurrency=4, batch_size=10) == 0  # every slot busy
    assert attempts.to_claim(concurrency=4, batch_size=10, ahead=2) == 2
    assert attempts.to_claim(concurrency=4, batch_size=3, ahead=10) == 3


def test_running_attempts_are_kept_in_the_order_they_started_until_they_stop() -> None:
    """Claim-ahead reads when each running attempt started, oldest first."""
    attempts = Attempts()
    for job_id in range(3):
        attempts.unstarted.append(_claimed(job_id))
    first, second, third = (attempts.start_next() for _ in range(3))
    attempts.finish(second)
    attempts.stop_running(first)
    since = list(attempts.running_since.values())
    assert list(attempts.running_since) == [third.held] and since[0] <= time.monotonic()
