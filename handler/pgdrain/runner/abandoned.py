"""Job threads a run gave up on. When a run returns with jobs still running (they outlasted
its budget), their leases end at the deadline and another attempt may start then. Each such
attempt is told at once (job.lease_lost() turns True); its thread is remembered for the
process, because a warm Lambda container keeps it running into the next invocation, whose
result reports how many are still alive (stale_threads); and its late outcome is logged,
never recorded (the fence would refuse it anyway once the job is reclaimed)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable

from pgdrain.controls import ALL_ON, Controls
from pgdrain.db.store import Held

log = logging.getLogger(__name__)

# Threads that runs in this process gave up on. Guarded by the lock: runs may overlap (tests,
# `pgdrain drain` loops).
_lock = threading.Lock()
_threads: set[threading.Thread] = set()


def stale_threads() -> int:
    """Job threads that earlier runs in this process abandoned and that are still running."""
    with _lock:
        for thread in [t for t in _threads if not t.is_alive()]:
            _threads.discard(thread)
        return len(_threads)


def warn_of_stale_threads(worker_id: str) -> int:
    """stale_threads(), said in a warning when there are any: a run starts with them."""
    stale = stale_threads()
    if stale:
        log.warning(
            "job threads abandoned by earlier runs in this process are still running",
            extra={"stale_threads": stale, "worker": worker_id},
        )
    return stale


class ThreadWatch:
    """Which worker thread runs which attempt of this run, and the attempts it gave up on.
    Written by the worker threads as well as the run's own, hence the lock."""

    def __init__(self, *, controls: Controls = ALL_ON) -> None:
        self._enabled = controls.mark_abandoned_lost
        self._lock = threading.Lock()
        self._running: dict[Held, threading.Thread] = {}
        self._given_up: set[Held] = set()

    def run(self, held: Held, call: Callable[[], object]) -> None:
        """Call a job in this worker thread, watched."""
        with self._lock:
            self._running[held] = threading.current_thread()
        outcome = "returned"
        try:
            call()
        except BaseException as exc:
            outcome = f"raised {type(exc).__name__}"
            raise
        finally:
            with self._lock:
                del self._running[held]
                late = held in self._given_up
            if late:
                log.warning(
                    "an abandoned attempt ended after its run gave up on it; its outcome is "
                    "not recorded",
                    extra={"job_id": held.id, "attempt_token": str(held.token), "outcome": outcome},
                )

    def give_up(self, running: Iterable[Held], lost_tokens: set[uuid.UUID]) -> None:
        """The run returns with these attempts still running: mark them lost at once and keep
        their threads on the process's list."""
        if not self._enabled:
            return
        with self._lock:
            for held in running:
                lost_tokens.add(held.token)
                self._given_up.add(held)
                thread = self._running.get(held)
                if thread is not None:
                    with _lock:
                        _threads.add(thread)
