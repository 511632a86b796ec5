"""Claim-ahead (claim_ahead.py): how many jobs a claim may take beyond the free slots, from
how long jobs run and how long a claim takes to come back."""

from __future__ import annotations

import math
import uuid

from pgdrain.controls import Controls
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts
from pgdrain.runner.prefetch import Prefetch, most_ahead

RUN_AT_US = 1_767_225_600_000_000  # a claimed job's run_at (2026-01-01) in microseconds


def measured(job_s: float, trip_s: float, *, batch: int = 10, concurrency: int = 10) -> Prefetch:
    ahead = Prefetch(batch, concurrency)
    ahead.job_ran(job_s)
    ahead.claim_took(trip_s)
    return ahead


def test_nothing_is_claimed_ahead_before_a_job_and_a_claim_were_measured() -> None:
    ahead = Prefetch(10, 10)
    assert ahead.allowance() == 0
    ahead.claim_took(0.001)
    assert ahead.allowance() == 0


def test_jobs_much_shorter_than_a_round_trip_are_claimed_a_batch_ahead() -> None:
    assert measured(0.00001, 0.0015).allowance() == 10


def test_the_allowance_is_the_slots_that_free_during_one_round_trip() -> None:
    # 10 slots, 5 ms jobs: one frees every 0.5 ms, so three during a 1.5 ms round trip.
    assert measured(0.005, 0.0015).allowance() == 3


def test_a_batch_larger_than_the_slots_is_claimed_whole_while_the_last_one_waits() -> None:
    """250 slots, batches of 1,000: just after a reply the run holds that batch, and the next
    claim may still take 1,000 (250 + 1,750 - 1,000), not the 250 that alternating would."""
    assert most_ahead(batch_size=10, concurrency=10) == 10  # a batch, as ever
    assert most_ahead(batch_size=4, concurrency=10) == 4
    assert most_ahead(batch_size=1000, concurrency=250) == 1750
    assert measured(0.00001, 0.0015, batch=1000, concurrency=250).allowance() == 1750
    attempts = Attempts()
    attempts.unstarted.extend(
        ClaimedJob(n, "default", "k", "{}", 1, 5, uuid.uuid4(), 0, RUN_AT_US) for n in range(1000)
    )
    assert attempts.to_claim(concurrency=250, batch_size=1000, ahead=1750) == 1000


def test_jobs_longer_than_concurrency_round_trips_are_never_claimed_ahead() -> None:
    assert measured(0.05, 0.0015).allowance() == 0


def test_one_slow_job_cuts_the_allowance_at_once() -> None:
    ahead = measured(0.00001, 0.0015)
    ahead.job_ran(5.0)
    assert ahead.allowance() == 0


def test_strict_ordering_and_the_control_never_claim_ahead() -> None:
    assert measured(0.00001, 0.0015, batch=1, concurrency=1).allowance() == 0
    off = Prefetch(10, 10, controls=Controls(prefetch=False))
    off.job_ran(0.00001)
    off.claim_took(0.0015)
    assert off.allowance() == 0


# A batch of ten 20 ms jobs started together at t = 0, claims coming back in 5 ms: two slots
# free per round trip when jobs end one after another, but these ten end together at 20 ms.
TOGETHER = [0.0] * 10


def test_jobs_started_together_are_claimed_for_a_round_trip_before_they_end() -> None:
    ahead = measured(0.020, 0.005)
    assert ahead.allowance(TOGETHER, now=0.010) == 2  # the count: nothing is ending yet
    assert ahead.allowance(TOGETHER, now=0.0151) == 10  # within a round trip of their end


def test_the_run_wakes_when_the_next_job_comes_within_a_round_trip_of_its_end() -> None:
    ahead = measured(0.020, 0.005)
    assert ahead.wake_at([0.0, 0.0, 0.004], now=0.001) == 0.015
    assert ahead.wake_at([0.0, 0.0, 0.004], now=0.016) == 0.019
    assert ahead.wake_at([0.0, 0.0, 0.004], now=0.020) == math.inf  # all counted already
    assert ahead.allowance([0.0, 0.0, 0.004], now=0.016) == 2  # the older two


def test_jobs_ending_together_count_only_where_claiming_ahead_pays() -> None:
    long = measured(0.200, 0.001)  # a round trip is half a percent of a job: no gain
    assert long.allowance(TOGETHER, now=0.1995) == 0
    assert long.wake_at(TOGETHER, now=0.0) == math.inf
    short = measured(0.00001, 0.0015)  # a whole batch ahead already: no wake-ups needed
    assert short.allowance(TOGETHER, now=0.0) == 10
    assert short.wake_at(TOGETHER, now=0.0) == math.inf
    off = Prefetch(10, 10, controls=Controls(prefetch=False))
    off.job_ran(0.020)
    off.claim_took(0.005)
    assert off.allowance(TOGETHER, now=0.0151) == 0
    assert off.wake_at(TOGETHER, now=0.0) == math.inf
