"""The drain's bounds, without a database: how long a statement may take (session.py), how
long the leases a run holds still last, and how many jobs it claims at once (attempts.py)."""

from __future__ import annotations

import time
import uuid

import pytest

from pgdrain import Budget, Settings
from pgdrain.db.session import MAX_TIMEOUT_MS, MIN_TIMEOUT_MS, Session
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts

RUN_AT_US = 1_767_225_600_000_000  # a claimed job's run_at (2026-01-01) in microseconds


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
        (1e9, MAX_TIMEOUT_MS),  # a long budget's: at most what PostgreSQL takes
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
    return ClaimedJob(job_id, "default", "k", "{}", 1, 5, uuid.uuid4(), 0, RUN_AT_US)


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


def test_prefetch_adds_the_slots_about_to_free_at_most_a_batch() -> None:
    attempts = Attempts()
    for job_id in range(4):
        attempts.unstarted.append(_claimed(job_id))
        attempts.start_next()
    assert attempts.to_claim(concurrency=4, batch_size=10) == 0  # every slot busy
    assert attempts.to_claim(concurrency=4, batch_size=10, ahead=2) == 2
    assert attempts.to_claim(concurrency=4, batch_size=3, ahead=10) == 3


@pytest.mark.parametrize("counted", [True, False], ids=["counted", "control: not counted"])
def test_a_claim_on_the_wire_holds_the_slots_of_all_it_may_bring(counted: bool) -> None:
    """Claims sent ahead and not read yet (pipeline.py) count as held: the next claim takes
    only what is left of the slots and their allowance. Not counted (the control), the run
    would claim past them, a batch for each claim on the wire."""
    attempts = Attempts()
    for job_id in range(4):
        attempts.unstarted.append(_claimed(job_id))
        attempts.start_next()  # four slots busy
    for job_id in range(4, 8):
        attempts.unstarted.append(_claimed(job_id))  # four claimed ahead, waiting
    on_the_wire = 4 if counted else 0  # one claim of four sent ahead, not read
    wanted = attempts.to_claim(concurrency=4, batch_size=4, ahead=8, on_the_wire=on_the_wire)
    held = len(attempts.running) + len(attempts.unstarted) + 4 + wanted
    assert held <= 4 + 8 if counted else held > 4 + 8


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


# -- attempts handed to the pool that no thread has started ------------------------------------


class FakePool:
    """Stands for WorkerPool's queue: what was submitted and no thread has taken."""

    def __init__(self) -> None:
        self.waiting: list[ClaimedJob] = []

    def submit(self, attempt: ClaimedJob) -> None:
        self.waiting.append(attempt)

    def take_back(self) -> list[ClaimedJob]:
        taken, self.waiting = self.waiting, []
        return taken


def _handed_over(pool: FakePool, started: int) -> tuple[Attempts, list[ClaimedJob]]:
    """Five attempts handed over at once (claimed ahead: two slots); `started` of them taken by
    a thread, the rest waiting in the pool."""
    attempts = Attempts()
    attempts.take_back_with(pool.take_back)
    claimed = [_claimed(job_id) for job_id in range(5)]
    attempts.unstarted.extend(claimed)
    attempts.start_all(pool.submit)
    del pool.waiting[:started]
    attempts.unstarted.append(_claimed(9))  # claimed since
    return attempts, claimed


def test_attempts_waiting_in_the_pool_are_unstarted_again_ahead_of_later_ones() -> None:
    pool = FakePool()
    attempts, claimed = _handed_over(pool, started=2)
    assert len(attempts.running) == 5 and attempts.to_claim(2, 10, ahead=10) == 6
    attempts.take_back()
    assert list(attempts.running) == [a.held for a in claimed[:2]]
    assert list(attempts.running_since) == [a.held for a in claimed[:2]]
    assert [a.id for a in attempts.unstarted] == [2, 3, 4, 9]
    assert [a.id for a in attempts.take_unstarted()] == [2, 3, 4, 9]


def test_releasing_and_forgetting_unstarted_attempts_covers_those_in_the_pool() -> None:
    pool = FakePool()
    attempts, claimed = _handed_over(pool, started=0)
    assert [a.id for a in attempts.take_unstarted()] == [0, 1, 2, 3, 4, 9]
    attempts, claimed = _handed_over(pool, started=1)
    attempts.forget_lost({claimed[3].held, claimed[0].held})  # 0 runs: told, not forgotten
    assert [a.id for a in attempts.unstarted] == [1, 2, 4, 9]
    assert claimed[0].attempt_token in attempts.lost_tokens


def test_a_worker_thread_says_when_its_attempt_really_started() -> None:
    """An attempt waits in the pool before a thread starts it: claim-ahead counts its time
    from then (claim_ahead.py reads running_since)."""
    pool = FakePool()
    attempts, claimed = _handed_over(pool, started=0)
    handed_at = attempts.running_since[claimed[3].held]
    attempts.started(claimed[3].held)
    assert attempts.running_since[claimed[3].held] >= handed_at
    assert list(attempts.running_since) == [a.held for a in claimed]  # the order kept
