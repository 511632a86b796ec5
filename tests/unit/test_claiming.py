"""Claiming (runner/claiming.py), without a database: how many jobs a claim asks for
(`claim_size`: the free slots, those prefetch expects to free, and a batch more for a claim
sent ahead), and what a claim's reply does to the run's attempts and counters
(`Claims.received`)."""

from __future__ import annotations

import time
import uuid

import pytest

from pgdrain import Budget, Settings
from pgdrain.db.session import Session
from pgdrain.db.store import ClaimedJob, Fenced, Held
from pgdrain.runner.attempts import Attempts, RunState
from pgdrain.runner.claim_statement import Claim
from pgdrain.runner.claiming import Claims, claim_size
from pgdrain.runner.completer import Completer
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.positions import ClaimStart
from pgdrain.runner.prefetch import Prefetch
from pgdrain.runner.summary import Counters

RUN_AT_US = 1_767_225_600_000_000  # a claimed job's run_at (2026-01-01) in microseconds

TEN_SLOTS = Settings(batch_size=10, concurrency=10)
FROM_THE_START = ClaimStart({}, None, 0.0, 0)  # no position, nothing named


def _claims(prefetch: Prefetch, run: RunState | None = None) -> Claims:
    if run is None:
        run = _run()
    return Claims(
        run,
        queues=("default",),
        lease_seconds=30.0,
        keep_done=True,
        reclaim_limit=100,
        prefetch=prefetch,
        completer=Completer(run, keep_done=True),
    )


def _run() -> RunState:
    budget = Budget.seconds(60)
    session = Session("postgresql://unused", Settings(), budget)  # never opened: nothing is sent
    return RunState(session, Attempts(), Deadline(budget, 1.0), Counters(None), "w")


def _measured(job_s: float, trip_s: float, settings: Settings = TEN_SLOTS) -> Prefetch:
    prefetch = Prefetch(settings.batch_size, settings.concurrency)
    prefetch.job_ran(job_s)
    prefetch.claim_took(trip_s)
    return prefetch


def _claimed(job_id: int) -> ClaimedJob:
    return ClaimedJob(job_id, "default", "k", "{}", 1, 5, uuid.uuid4(), 0, RUN_AT_US)


def _with(running: int, unstarted: int = 0) -> Attempts:
    attempts = Attempts()
    attempts.unstarted.extend(_claimed(n) for n in range(running))
    for _ in range(running):
        attempts.start_next()
    attempts.unstarted.extend(_claimed(100 + n) for n in range(unstarted))
    return attempts


@pytest.mark.parametrize(
    ("running", "size"),
    [
        (0, 10),  # every slot free: a batch
        (4, 6),  # more than half free: what they start
        (6, 0),  # fewer than half: not worth a round trip while jobs run
        (10, 0),
    ],
)
def test_without_measurements_a_claim_is_for_the_free_slots(running: int, size: int) -> None:
    """Before a job and a claim were measured prefetch adds nothing."""
    assert claim_size(_claims(Prefetch(10, 10)), _with(running), TEN_SLOTS) == size


def test_prefetch_adds_the_slots_that_free_during_a_round_trip() -> None:
    """Jobs of 5 s, claims of 1.5 s: 3 of 10 slots free during a round trip. With 8 running,
    2 free and 3 about to: a claim of 5, where without prefetch the 2 free wait."""
    assert claim_size(_claims(_measured(5.0, 1.5)), _with(8), TEN_SLOTS) == 5
    assert claim_size(_claims(Prefetch(10, 10)), _with(8), TEN_SLOTS) == 0


@pytest.mark.parametrize(
    ("job_s", "trip_s", "ahead"),
    [(0.00001, 0.0015, 10), (5.0, 1.5, 0)],
    ids=["a batch frees per round trip", "control: 3 slots free per round trip"],
)
def test_a_claim_sent_ahead_takes_a_batch_more_only_while_a_whole_batch_frees(
    job_s: float, trip_s: float, ahead: int
) -> None:
    """Ten running and ten claimed ahead: a claim made now takes nothing more, but one sent
    ahead is read a round trip later, when a batch has freed, and takes a batch more; unless
    fewer than a batch free per round trip (the control), when it is not sent at all."""
    claims = _claims(_measured(job_s, trip_s))
    assert claim_size(claims, _with(10, unstarted=10), TEN_SLOTS) == 0
    assert claim_size(claims, _with(10, unstarted=10), TEN_SLOTS, pipelined_claim=True) == ahead


def test_at_concurrency_one_nothing_is_claimed_ahead() -> None:
    """Strict ordering: one job at a time, none waiting, none sent ahead."""
    one = Settings(batch_size=1, concurrency=1)
    claims = _claims(_measured(0.00001, 0.0015, one))
    assert claim_size(claims, _with(0), one) == 1
    assert claim_size(claims, _with(1), one) == 0
    assert claim_size(claims, _with(0), one, pipelined_claim=True) == 0


def test_a_reply_makes_its_jobs_unstarted_attempts_and_counts_its_completions() -> None:
    """The reply of a claim that recorded two attempts done, one refused by the fence (its
    lease was lost), and took three jobs."""
    run = _run()
    claims = _claims(Prefetch(10, 10), run)
    done, refused = Held(1, uuid.uuid4()), Held(2, uuid.uuid4())
    taken = [_claimed(n) for n in (3, 4, 5)]
    claim = Claim(uuid.uuid4(), [], [done, refused], 3, time.monotonic(), FROM_THE_START)

    assert claims.received(claim, Fenced(frozenset({done}), frozenset({refused})), taken) == 3
    assert list(run.attempts.unstarted) == taken
    assert run.counters.values["claimed"] == 3
    assert run.counters.values["done"] == 1 and run.counters.unsaid == [refused]
    assert run.attempts.lease_seconds_left(30.0) is not None  # the leases it took count
