"""The worker pool starts its threads when the first job comes (none for a run with nothing to
do), all of them, so that no job waits for a thread while fewer than `size` run. Blocking jobs
are held on a barrier: what runs at once is shown, not timed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from helpers.threads import started_threads
from pgdrain.pool import Outcome, WorkerPool

WAIT = 10.0  # seconds: only reached if a job never runs (the test fails then)

# The `pools` fixture: makes a pool of a size and a job function, closed after the test.
MakePool = Callable[[int, Callable[[int], object]], WorkerPool[int]]


def take(pool: WorkerPool[int], count: int) -> list[Outcome[int]]:
    taken: list[Outcome[int]] = []
    while len(taken) < count:
        taken.extend(pool.take(WAIT))
    return taken


@pytest.fixture
def pools() -> Iterator[MakePool]:
    made: list[WorkerPool[int]] = []

    def make(size: int, run: Callable[[int], object]) -> WorkerPool[int]:
        pool: WorkerPool[int] = WorkerPool(size, run, name="test-pool")
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def test_a_pool_given_no_job_starts_no_thread(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    names = started_threads(monkeypatch)
    pool = pools(250, lambda n: None)
    assert list(pool.take(0.0)) == []
    assert names == []


def test_the_first_job_starts_every_thread(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    names = started_threads(monkeypatch)
    pool = pools(10, lambda n: None)
    for n in range(20):
        pool.submit(n)
        [outcome] = take(pool, 1)
        assert outcome.item == n and outcome.error is None
    assert sorted(names) == sorted(f"test-pool-{i}" for i in range(10))


def test_every_job_out_at_once_runs_at_once(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    """Eight blocking jobs in a pool of eight: each gets a thread of its own at once (the
    barrier opens only when all eight wait on it together)."""
    names = started_threads(monkeypatch)
    together = threading.Barrier(8, timeout=WAIT)
    pool = pools(8, lambda n: together.wait())
    for n in range(8):
        pool.submit(n)
    outcomes = take(pool, 8)
    assert all(o.error is None for o in outcomes)  # a broken barrier would be the error
    assert sorted(o.item for o in outcomes) == list(range(8))
    assert len(names) == 8


def test_no_more_threads_than_its_size(monkeypatch: pytest.MonkeyPatch, pools: MakePool) -> None:
    """Control for the test above: with room for only four at once, the barrier of eight can
    never open, and the jobs past the size wait for a thread instead of getting a fifth."""
    names = started_threads(monkeypatch)
    together = threading.Barrier(8, timeout=0.5)
    pool = pools(4, lambda n: together.wait())
    for n in range(8):
        pool.submit(n)
    outcomes = take(pool, 8)
    assert any(isinstance(o.error, threading.BrokenBarrierError) for o in outcomes)
    assert len(names) == 4


def test_a_thread_that_cannot_start_leaves_its_job_to_the_running_ones(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    pools: MakePool,
) -> None:
    """At the process's thread limit the pool goes on with the threads it has: every job
    still runs, later; none is lost."""
    real_start = threading.Thread.start
    started: list[str] = []

    def start(thread: threading.Thread) -> None:
        if len(started) == 2:
            raise RuntimeError("can't start new thread")
        real_start(thread)
        started.append(thread.name)

    monkeypatch.setattr(threading.Thread, "start", start)
    ran: list[int] = []
    pool = pools(10, ran.append)
    with caplog.at_level(logging.WARNING, logger="pgdrain.pool"):
        for n in range(6):
            pool.submit(n)
        outcomes = take(pool, 6)
    assert sorted(o.item for o in outcomes) == sorted(ran) == list(range(6))
    assert len(started) == 2
    assert "could not start another job thread" in caplog.text


def test_a_pool_that_cannot_start_any_thread_says_so(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    def start(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", start)
    pool = pools(10, lambda n: None)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.submit(1)
