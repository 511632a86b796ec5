"""A run's claim positions (runner/positions.py), without a database: what each claim's reply
leaves for the next claim, and when they are dropped (their age, a reconnect, a claim of none).
The statement that reads from them is tested in tests/integration/test_claim_position.py."""

from __future__ import annotations

import uuid

from pgdrain.db.store import ClaimedJob, ClaimPosition
from pgdrain.runner.positions import POSITION_MAX_AGE, Positions

RUN_AT_US = 1_767_225_600_000_000  # a claimed job's run_at (2026-01-01) in microseconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _job(job_id: int, queue: str = "default", priority: int = 0) -> ClaimedJob:
    return ClaimedJob(job_id, queue, "k", "{}", 1, 5, uuid.uuid4(), priority, RUN_AT_US)


def _full_claim(positions: Positions, jobs: list[ClaimedJob]) -> None:
    positions.received(positions.start(), jobs, len(jobs), None)


def test_the_first_claim_reads_every_queue_from_its_start() -> None:
    start = Positions(clock=Clock()).start()
    assert (dict(start.positions), start.served) == ({}, None)


def test_each_queue_starts_after_the_last_job_the_run_claimed_there() -> None:
    positions = Positions(clock=Clock())
    # In the claim's order (priority, run_at, id), the queues taking turns.
    claimed = [_job(1, "a"), _job(2, "b"), _job(3, "a", priority=1), _job(4, "b", priority=2)]
    positions.received(positions.start(), claimed, 4, ("a", "b", "c"))

    start = positions.start()
    assert start.positions == {
        "a": ClaimPosition(1, RUN_AT_US, 3),
        "b": ClaimPosition(2, RUN_AT_US, 4),
    }  # none for c: it gave nothing, so its next claim reads it from the start
    assert start.served == ("a", "b", "c")  # the queues that claim found, named by the next


def test_a_short_claim_keeps_the_positions_it_took_and_finds_the_queues_again() -> None:
    """Fewer jobs than asked: the queues it read ran out, or a share of the batch held them
    back (a claim naming many queues). A queue it took jobs from keeps its position (a range
    that ran out is read from the floor by the same statement); the queues found are found
    again. A claim that took nothing leaves none."""
    positions = Positions(clock=Clock())
    positions.received(positions.start(), [_job(1, "a"), _job(2, "b")], 2, ("a", "b"))
    positions.received(positions.start(), [_job(3, "a")], 2, None)
    start = positions.start()
    assert (dict(start.positions), start.served) == ({"a": ClaimPosition(0, RUN_AT_US, 3)}, None)
    positions.received(positions.start(), [], 2, None)  # nothing at all
    assert dict(positions.start().positions) == {}


def test_positions_last_at_most_their_max_age() -> None:
    clock = Clock()
    positions = Positions(clock=clock)
    _full_claim(positions, [_job(1), _job(2)])
    clock.now += POSITION_MAX_AGE / 2
    _full_claim(positions, [_job(3), _job(4)])  # from the positions: their age goes on
    clock.now += POSITION_MAX_AGE / 2 - 0.001
    assert positions.start().positions == {"default": ClaimPosition(0, RUN_AT_US, 4)}

    clock.now += 0.001
    start = positions.start()
    assert (dict(start.positions), start.served) == ({}, None)
    assert start.since == clock.now  # the claim from the start begins the next age


def test_a_claim_sent_before_a_reconnect_moves_nothing() -> None:
    """Its reply was lost and asked for after the reconnect (lost-reply recovery): the
    positions start again from the claims made since."""
    positions = Positions(clock=Clock())
    _full_claim(positions, [_job(1), _job(2)])
    on_the_wire = positions.start()
    positions.reconnected()
    assert dict(positions.start().positions) == {}
    positions.received(on_the_wire, [_job(3), _job(4)], 2, None)
    assert dict(positions.start().positions) == {}


def test_control_switched_off_every_claim_reads_from_the_start() -> None:
    positions = Positions(enabled=False, clock=Clock())
    positions.received(positions.start(), [_job(1), _job(2)], 2, ("default",))
    start = positions.start()
    assert (dict(start.positions), start.served) == ({}, None)
