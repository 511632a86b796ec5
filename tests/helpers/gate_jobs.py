"""A job kind that holds its run mid-drain until the test lets it go: `held` says which jobs
have started (in order), `release(job_id)` lets one return. For tests that must act while a
run is draining, deterministically (PGDRAIN_JOBS=helpers.gate_jobs)."""

from __future__ import annotations

import queue
import threading

from pgdrain import Job, Registry

jobs = Registry()
TIMEOUT_SECONDS = 30.0

held: queue.Queue[int] = queue.Queue()
_gates: dict[int, threading.Event] = {}
_lock = threading.Lock()


def _gate(job_id: int) -> threading.Event:
    with _lock:
        return _gates.setdefault(job_id, threading.Event())


def release(job_id: int) -> None:
    _gate(job_id).set()


def next_held(timeout: float = TIMEOUT_SECONDS) -> int:
    """The id of the next job to start waiting at its gate."""
    return held.get(timeout=timeout)


def reset() -> None:
    """Let every job still waiting go, and forget them (a test's teardown)."""
    with _lock:
        for gate in _gates.values():
            gate.set()
        _gates.clear()
    while not held.empty():
        held.get_nowait()


@jobs.job("wait_at_gate")
def wait_at_gate(job: Job) -> None:
    gate = _gate(job.id)
    held.put(job.id)
    if not gate.wait(TIMEOUT_SECONDS):
        raise TimeoutError(f"job {job.id} was never released")
