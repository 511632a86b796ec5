"""A run at concurrency 1 runs its one job on the loop's own thread: no hand-over.

At any other concurrency the run's thread claims and worker threads run the jobs
(worker_threads.py). At concurrency 1 only one of the two can be busy at a time: the next claim
waits for the one slot (it completes the job that ran). Handing each job to a worker thread and
its outcome back then costs two thread wake-ups a job, in series with every round trip
(docs/decisions/0003).

So the run's loop itself goes to a thread of its own (LoopThread), and runs each job there,
in place of handing it over (OneSlot stands where the WorkerPool would). The calling thread
only watches: it sleeps until the next thing the loop would do if it were free (a heartbeat,
the final margin, the end of a stop's grace) and, if the loop's thread is inside a job then,
does it in its place, on the same connection, which the job does not use. A lock keeps the two
off the connection at once: the loop's thread holds it except while its job runs. If the run
must end while the job still runs (the final margin, a stop's grace over), the calling thread
ends it, as the loop would have, and returns: the job runs on, abandoned (abandoned.py), and
its thread, once it returns, finds the run given up and touches nothing of it. The job never
runs on the calling thread, so the handler returns at its deadline whatever the job does.
Unlike a WorkerPool, which starts no thread for a run that finds nothing, a run at concurrency 1
always starts this one: its loop runs there from the connect on."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from pgdrain.controls import ALL_ON, Controls
from pgdrain.runner.worker_threads import Outcome, close_thread_loop, mark_job_thread, outcome_of

T = TypeVar("T")
R = TypeVar("R")

THREAD_NAME = "pgdrain-job-0"  # it runs the jobs: named as a worker thread would be


class GivenUp(BaseException):
    """Raised in the loop's thread when its job returns after the calling thread ended the run:
    nothing of the run may be touched any more. A BaseException, so that no handler of the
    loop's takes it for a database error."""


class Wake:
    """A wake-up that one thread waits for and another, or a stop request's signal handler,
    gives. Not a threading.Event: its set() takes the lock that its wait() and clear() hold for
    a few bytecodes, and a handler that runs in the main thread while it is inside them would
    wait on itself for ever. SimpleQueue.put is reentrant."""

    def __init__(self) -> None:
        self._given: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        self._given.put(None)

    def wait_and_clear(self, seconds: float) -> None:
        """Wait until given or `seconds` pass (0: not at all), then forget every wake-up given
        so far: the waiter looks at what it was woken for itself."""
        try:
            self._given.get(timeout=seconds) if seconds > 0 else self._given.get_nowait()
            while True:
                self._given.get_nowait()
        except queue.Empty:
            pass


class OneSlot(Generic[T]):
    """The WorkerPool of a run at concurrency 1, run by the loop's thread: `submit` keeps the
    job, `take` runs it there and then. `lock` is held by the loop's thread whenever it is not
    inside a job."""

    def __init__(self, run: Callable[[T], object], *, controls: Controls = ALL_ON) -> None:
        self._run = run
        self._end_when_given_up = controls.end_the_loop_thread_with_the_run
        self._waiting: deque[T] = deque()
        self.lock = threading.Lock()
        self.job_running = False
        self.given_up = False  # set by the calling thread, under the lock, when it ends the run
        self._loop_wake = Wake()  # the loop's thread, waiting with nothing to run
        self.watch_wake = Wake()  # the calling thread, waiting for its next duty

    def submit(self, item: T) -> None:
        self._waiting.append(item)

    def take(self, wait: float) -> list[Outcome[T]]:
        """Run the job submitted, here, and return its outcome; with none, wait up to `wait`
        seconds for a wake-up (a stop request) and return nothing. Called with `lock` held; it
        is let go while the job runs."""
        if not self._waiting:
            self._loop_wake.wait_and_clear(wait)  # the loop looks at what woke it itself
            return []
        item = self._waiting.popleft()
        self.job_running = True
        self.lock.release()
        try:
            outcome = outcome_of(self._run, item)  # as a worker thread runs it
        finally:
            self.lock.acquire()
            self.job_running = False
        if self.given_up and self._end_when_given_up:
            raise GivenUp
        return [outcome]

    def take_back(self) -> list[T]:
        """The job submitted and not started (none once `take` has it)."""
        waiting = list(self._waiting)
        self._waiting.clear()
        return waiting

    def wake(self) -> None:
        """Wake both threads (a stop request; safe from a signal handler: Wake)."""
        self._loop_wake.set()
        self.watch_wake.set()

    def close(self) -> None:
        pass  # no thread of its own: LoopThread ends with the loop


class LoopThread(Generic[R]):
    """The run's loop on a thread of its own, holding `slot.lock` but while its job runs.
    `body` returns the run's ending; an exception it raises is raised again by `watch`."""

    def __init__(self, slot: OneSlot[T], body: Callable[[], R]) -> None:
        self._slot = slot
        self._body = body
        self._ending: R | None = None
        self._error: BaseException | None = None
        self._done = False
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        slot = self._slot
        mark_job_thread()  # async jobs get this thread's own event loop, as in a worker
        slot.lock.acquire()
        try:
            self._ending = self._body()
        except GivenUp:
            pass  # the calling thread ended the run: nothing here is ours any more
        except BaseException as exc:
            self._error = exc
        finally:
            self._done = True
            slot.lock.release()
            slot.watch_wake.set()
            close_thread_loop()

    def watch(
        self,
        next_duty_at: Callable[[], float],
        duties: Callable[[], R | None],
        let_go: Callable[[], None],
    ) -> R | None:
        """In the calling thread, until the run ends: at each duty's time (`next_duty_at`,
        monotonic), if the loop's thread is inside its job, call `duties` in its place. When
        they return an ending, the run is given up: `let_go` is called (what the loop's thread
        would have done at its end), the loop's thread stops once its job returns, and that
        ending is returned. Otherwise the loop's own ending, once its thread is done.
        An exception, raised by `duties` or while waiting, gives the run up the same way and is
        raised again; one raised in the loop's thread is raised here."""
        slot = self._slot
        try:
            while True:
                slot.watch_wake.wait_and_clear(max(0.0, next_duty_at() - time.monotonic()))
                if self._done:
                    break
                with slot.lock:  # waits while the loop's thread is in the loop, doing them
                    if self._done:
                        break
                    if not slot.job_running:
                        continue
                    try:
                        ending = duties()
                    except BaseException:
                        self._give_up(let_go)  # before the job's thread may take the lock
                        raise
                    if ending is not None:
                        self._give_up(let_go)
                        return ending
        except BaseException:
            if not slot.given_up:  # interrupted while waiting (a KeyboardInterrupt)
                with slot.lock:
                    if not self._done:
                        self._give_up(let_go)
            raise
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._ending

    def _give_up(self, let_go: Callable[[], None]) -> None:
        """With the lock held and the loop's thread inside its job."""
        self._slot.given_up = True
        let_go()
