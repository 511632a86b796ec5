"""The worker pool starts its threads when the first job comes (none for a run with nothing to
do), all of them, so that no job waits for a thread while fewer than `size` run: the first at
once, the others from a starter thread while the first jobs run. Blocking jobs are held on a
barrier, thread starts on an event: what runs at once is shown, not timed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from helpers.threads import on_thread_start, started_threads
from pgdrain.runner.worker_threads import Outcome, WorkerPool

WAIT = 10.0  # seconds: only reached if a job never runs (the test fails then)
EXIT_WAIT = 2.0  # seconds, all threads together: only reached by a thread that never exits

# The `pools` fixture: makes a pool of a size and a job function, closed after the test.
MakePool = Callable[[int, Callable[[int], object]], WorkerPool[int]]


def workers(names: list[str]) -> list[str]:
    """The pool's worker threads among the threads started (not its starter)."""
    return [name for name in names if name.startswith("test-pool-")]


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
    pool.close()  # once the starter is done
    assert sorted(workers(names)) == sorted(f"test-pool-{i}" for i in range(10))
    assert names.count("starting-test-pool") == 1


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
    pool.close()  # once the starter is done
    assert len(workers(names)) == 8


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
    pool.close()
    assert len(workers(names)) == 4


def _six_jobs_when_starts_fail(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    pools: MakePool,
    refuse: Callable[[threading.Thread, list[str]], bool],
) -> list[str]:
    """Six jobs in a pool of ten whose thread starts picked by `refuse` (the thread, the names
    started so far) fail as at the process's thread limit: every job still runs, later, none
    is lost, and the pool says so. Returns the names of the threads that started."""

    def at_the_limit(thread: threading.Thread, started: list[str]) -> None:
        if refuse(thread, started):
            raise RuntimeError("can't start new thread")

    started = on_thread_start(monkeypatch, at_the_limit)
    ran: list[int] = []
    pool = pools(10, ran.append)
    with caplog.at_level(logging.WARNING, logger="pgdrain.runner.worker_threads"):
        for n in range(6):
            pool.submit(n)
        outcomes = take(pool, 6)
        pool.close()  # once the starter has given up
    assert sorted(o.item for o in outcomes) == sorted(ran) == list(range(6))
    assert "could not start another job thread" in caplog.text
    return started


def test_a_thread_that_cannot_start_leaves_its_job_to_the_running_ones(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    pools: MakePool,
) -> None:
    def third_worker(thread: threading.Thread, started: list[str]) -> bool:
        return thread.name.startswith("test-pool-") and len(workers(started)) == 2

    started = _six_jobs_when_starts_fail(monkeypatch, caplog, pools, third_worker)
    assert workers(started) == ["test-pool-0", "test-pool-1"]


def test_a_starter_that_cannot_start_leaves_the_jobs_to_the_first_thread(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    pools: MakePool,
) -> None:
    def starter(thread: threading.Thread, started: list[str]) -> bool:
        return thread.name == "starting-test-pool"

    started = _six_jobs_when_starts_fail(monkeypatch, caplog, pools, starter)
    assert workers(started) == ["test-pool-0"]


def hold_start_of(monkeypatch: pytest.MonkeyPatch, name: str) -> threading.Event:
    """Starting the thread called `name` waits (in the thread that starts it) until the event
    returned is set."""
    release = threading.Event()

    def hold(thread: threading.Thread, started: list[str]) -> None:
        if thread.name == name:
            assert release.wait(WAIT), "never released"

    on_thread_start(monkeypatch, hold)
    return release


def test_the_first_job_runs_while_the_other_threads_are_still_starting(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    """The starter is held before the second thread: the first job has run anyway (and the
    submit returned at once: it starts only the first thread)."""
    release = hold_start_of(monkeypatch, "test-pool-1")
    pool = pools(10, lambda n: None)
    pool.submit(7)
    [outcome] = take(pool, 1)
    assert (outcome.item, outcome.error, release.is_set()) == (7, None, False)
    release.set()


def _close_while_the_starter_is_held(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool, wait_for_starter: bool
) -> list[threading.Thread]:
    """A pool of ten whose starter is held before the sixth thread; close() is called, then
    the starter released (by close() itself when it waits for the starter, else after it).
    Returns the pool's threads still alive once the others have exited."""
    release = hold_start_of(monkeypatch, "test-pool-5")
    real_join = threading.Thread.join

    def join(thread: threading.Thread, timeout: float | None = None) -> None:
        if thread.name == "starting-test-pool":
            release.set()
        real_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)
    pool = pools(10, lambda n: None)
    pool.submit(0)
    take(pool, 1)
    pool.close(wait_for_starter=wait_for_starter)
    release.set()
    for starter in [t for t in threading.enumerate() if t.name == "starting-test-pool"]:
        real_join(starter, WAIT)  # every thread it starts has started then
    threads = [t for t in threading.enumerate() if t.name.startswith("test-pool-")]
    deadline = time.monotonic() + EXIT_WAIT
    for thread in threads:
        real_join(thread, max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


def test_close_waits_for_the_starter_so_every_thread_exits(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    assert _close_while_the_starter_is_held(monkeypatch, pools, wait_for_starter=True) == []


def test_control_close_without_waiting_for_the_starter_leaves_threads_waiting(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    """The same timeline, close() not waiting: the threads started after it never get their
    request to exit (in a warm Lambda container they would wait from run to run). The pools
    fixture's own close() ends them after the test."""
    alive = _close_while_the_starter_is_held(monkeypatch, pools, wait_for_starter=False)
    assert alive, "every thread exited"


def test_a_pool_that_cannot_start_any_thread_says_so(
    monkeypatch: pytest.MonkeyPatch, pools: MakePool
) -> None:
    def at_the_limit(thread: threading.Thread, started: list[str]) -> None:
        raise RuntimeError("can't start new thread")

    on_thread_start(monkeypatch, at_the_limit)
    pool = pools(10, lambda n: None)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.submit(1)


# -- taking back the jobs no thread has started ------------------------------------------------


def _one_thread_busy(pools: MakePool, ran: list[int]) -> tuple[WorkerPool[int], threading.Event]:
    """A pool of one thread running job 1, held on an event; jobs 2 and 3 wait for it."""
    release, first_running = threading.Event(), threading.Event()

    def run(n: int) -> None:
        ran.append(n)
        if n == 1:
            first_running.set()
            assert release.wait(WAIT), "never released"

    pool = pools(1, run)
    for n in (1, 2, 3):
        pool.submit(n)
    assert first_running.wait(WAIT), "job 1 never started"
    return pool, release


def test_take_back_returns_the_jobs_no_thread_started_and_they_never_run(
    pools: MakePool,
) -> None:
    ran: list[int] = []
    pool, release = _one_thread_busy(pools, ran)

    assert pool.take_back() == [2, 3]  # oldest first; job 1 runs on
    release.set()
    assert [o.item for o in take(pool, 1)] == [1]
    pool.close()
    assert list(pool.take(0.2)) == [] and ran == [1]


def test_control_without_take_back_the_waiting_jobs_run_after_all(pools: MakePool) -> None:
    ran: list[int] = []
    pool, release = _one_thread_busy(pools, ran)
    release.set()
    assert sorted(o.item for o in take(pool, 3)) == [1, 2, 3] and ran == [1, 2, 3]
