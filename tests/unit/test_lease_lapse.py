"""When a running job hears lease_lost() without a beat having found the lease gone: once a
lease has passed since the last renewal was sent (Attempts.lease_lapsed), on the run's clock.
A claim after an idle spell, or beside attempts all found lost, starts the count afresh: a
beat renews only the leases held."""

from __future__ import annotations

import time
import uuid

import pytest

from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts

LEASE = 30.0


def _claimed() -> ClaimedJob:
    return ClaimedJob(1, "default", "k", "{}", 1, 5, uuid.uuid4(), 0, 0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_a_lease_lapses_a_lease_after_the_last_renewal_was_sent(clock: list[float]) -> None:
    attempts = Attempts(LEASE)
    attempts.leases_claimed(clock[0])
    attempts.unstarted.append(_claimed())
    clock[0] += LEASE - 1
    assert not attempts.lease_lapsed()
    attempts.leases_renewed(clock[0])  # a beat sent now, answered
    clock[0] += LEASE - 1
    assert not attempts.lease_lapsed()
    clock[0] += 2  # the next beat's reply has not come within a lease
    assert attempts.lease_lapsed()


def test_a_claim_after_an_idle_spell_starts_the_count_afresh(clock: list[float]) -> None:
    attempts = Attempts(LEASE)
    attempts.leases_claimed(clock[0])  # a job claimed, run and completed: nothing held now
    clock[0] += 10 * LEASE  # idle: no beat renews what is not held
    attempts.leases_claimed(clock[0])
    attempts.unstarted.append(_claimed())
    assert not attempts.lease_lapsed()


def test_control_not_told_of_lapses_it_never_says_so(clock: list[float]) -> None:
    attempts = Attempts(LEASE, told_of_lapses=False)
    attempts.leases_claimed(clock[0])
    attempts.unstarted.append(_claimed())
    clock[0] += 10 * LEASE
    assert not attempts.lease_lapsed()


def test_a_claim_beside_only_lost_attempts_starts_the_count_afresh(clock: list[float]) -> None:
    """A review's report: a job cancelled while it ran (its lease found lost) runs on; the
    beat renews nothing while no lease is held; a job claimed later heard lease_lost() at its
    start, its lease fresh."""
    attempts = Attempts(LEASE)
    attempts.leases_claimed(clock[0])
    cancelled = _claimed()
    attempts.running[cancelled.held] = cancelled
    attempts.lost_tokens.add(cancelled.attempt_token)  # found lost by a beat; runs on
    clock[0] += 10 * LEASE
    attempts.leases_claimed(clock[0])
    attempts.unstarted.append(_claimed())
    assert not attempts.lease_lapsed()
