"""A fixed number of daemon threads, started with the first job, that run job functions and
report each outcome on a queue.

Daemon threads, unlike concurrent.futures' workers, do not hold the process open at exit: a job
still running when the budget is spent must not keep a CLI drain (or a Lambda handler) alive.
Its lease ends at the run's deadline, so the job is reclaimable then."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

# Each worker thread keeps one event loop for the `async def` jobs it runs, made on first use
# and closed when the worker exits: reusing it is cheaper than asyncio.run() per job (a new
# loop each time; see docs/jobs.md for the figures).
_worker = threading.local()


def mark_job_thread() -> None:
    """The calling thread runs jobs (a WorkerPool's, or a run's loop at concurrency 1:
    loop_thread.py): thread_loop() gives it an event loop of its own."""
    _worker.in_pool = True


def thread_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop of the calling job thread (made on first use), or None outside a thread
    marked as one (mark_job_thread)."""
    if not getattr(_worker, "in_pool", False):
        return None
    loop: asyncio.AbstractEventLoop | None = getattr(_worker, "loop", None)
    if loop is None or loop.is_closed():
        loop = _worker.loop = asyncio.new_event_loop()
    return loop


def close_thread_loop() -> None:
    """Close the calling job thread's event loop, if it made one; at the thread's end."""
    loop: asyncio.AbstractEventLoop | None = getattr(_worker, "loop", None)
    if loop is not None and not loop.is_closed():
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    _worker.loop = None


@dataclass(slots=True)  # one per job: slots, not frozen (cheaper to make: decisions/0004)
class Outcome(Generic[T]):
    """What became of one job a worker thread ran: its item, and the exception it raised if any."""

    item: T
    error: BaseException | None
    seconds: float = 0.0  # how long the job ran (prefetch reads it)


class WorkerPool(Generic[T]):
    """`size` threads, started when the first job is submitted: a run that finds nothing to do
    (most runs) starts none. All of them at once (one by one, interleaved with their jobs, they
    switched context twice as often). The first is started by the first submit, the others by
    a starter thread, so the run's thread sends its next claim while they start
    (docs/decisions/0009)."""

    def __init__(self, size: int, run: Callable[[T], object], name: str = "pgdrain-job") -> None:
        self._size = size
        self._name = name
        self._run = run
        self._tasks: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        # None is a wake-up (pgdrain.runner.stop), not an outcome.
        self.outcomes: queue.SimpleQueue[Outcome[T] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []  # the first by submit, the rest by the starter
        self._starter: threading.Thread | None = None

    def submit(self, item: T) -> None:
        if not self._threads:
            self._start_thread()  # raises if not even one can start: the run cannot go on
            self._start_starter()
        self._tasks.put(item)

    def _start_starter(self) -> None:
        if len(self._threads) >= self._size:
            return
        starter = threading.Thread(
            target=self._start_the_rest, name=f"starting-{self._name}", daemon=True
        )
        try:
            starter.start()
        except RuntimeError:  # "can't start new thread": the process's limit
            self._run_with_the_threads_started()
            return
        self._starter = starter

    def _start_the_rest(self) -> None:
        while len(self._threads) < self._size:
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": the process's limit
            if not self._threads:
                raise
            self._run_with_the_threads_started()
            return
        self._threads.append(thread)

    def _run_with_the_threads_started(self) -> None:
        # The jobs wait for a thread that is running one: later, not lost.
        log.warning(
            "could not start another job thread; jobs share the ones running",
            extra={"threads": len(self._threads)},
        )
        self._size = len(self._threads)

    def take_back(self) -> list[T]:
        """The jobs submitted that no thread has taken yet, oldest first; none of them will run.
        A thread that takes one at the same moment runs it: each job goes to one or the other
        (SimpleQueue's get is atomic), so none is run twice and none is dropped by both."""
        waiting: list[T] = []
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                return waiting
            if item is None:  # a request to exit, after close(): keep it for a thread
                self._tasks.put(None)
                return waiting
            waiting.append(item)

    def take(self, wait: float) -> Iterator[Outcome[T]]:
        """Wait up to `wait` seconds for an outcome, then yield it and every other one ready,
        each taken as the caller asks for the next. A wake-up ends the wait and is skipped."""
        try:
            outcome = self.outcomes.get(timeout=wait) if wait > 0 else self.outcomes.get_nowait()
        except queue.Empty:
            return
        while True:
            if outcome is not None:
                yield outcome
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                return

    def wake(self) -> None:
        """Wake whoever waits for an outcome. Safe from a signal handler (SimpleQueue.put is
        reentrant)."""
        self.outcomes.put(None)

    def close(self, *, wait_for_starter: bool = True) -> None:
        """Ask idle workers to exit; a worker still running a job exits after it. Waits until
        the starter has started them all, so that each gets its request to exit: a thread
        started later would wait for work forever, in a warm Lambda container from run to run.
        (`wait_for_starter=False` is a test's control.)"""
        if wait_for_starter and self._starter is not None:
            self._starter.join()
        for _ in self._threads:
            self._tasks.put(None)

    def _work(self) -> None:
        mark_job_thread()
        try:
            self._work_until_closed()
        finally:
            close_thread_loop()

    def _work_until_closed(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            self.outcomes.put(outcome_of(self._run, item))


def outcome_of(run: Callable[[T], object], item: T) -> Outcome[T]:
    """Run one job and say what became of it: whatever it raises is its outcome, reported to
    the run, which records the failure."""
    started, pid = time.monotonic(), os.getpid()
    try:
        run(item)
    except BaseException as exc:
        end_if_forked(pid, exc)
        return Outcome(item, exc, time.monotonic() - started)
    end_if_forked(pid)
    return Outcome(item, None, time.monotonic() - started)


def in_a_forked_child(pid: int) -> bool:
    return os.getpid() != pid


def end_if_forked(pid: int, raised: BaseException | None = None) -> None:
    """A child the job forked (os.fork) and let return lands here, in a copy of the run: it
    would take the run's jobs waiting in memory and run them a second time, or claim on the
    parent's connection, and then wait forever for work. It ends at once instead, as a
    multiprocessing child does: its output flushed, then os._exit (no cleanup of the parent's
    state it holds a copy of, no lock of it taken), with the status its SystemExit gives, 1
    for another exception, 0 for a return. Called as the job's function returns (execute.py),
    before the middleware, and again here for whatever forked after it."""
    if not in_a_forked_child(pid):
        return
    status = 0 if raised is None else 1
    if isinstance(raised, SystemExit):
        status = raised.code if isinstance(raised.code, int) else 0 if raised.code is None else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing more to save
            pass
    os.write(2, b"pgdrain: a process a job forked returned into the run; it exits here\n")
    os._exit(status)
