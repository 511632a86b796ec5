"""The drain keeps each attempt apart from the job's other attempts: one run may hold two
attempts of the same job, and the older one's outcome must not end the newer
(docs/reliability.md, "Faults of the drain loop")."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest

from helpers.fixtures import job_row, wait_for
from pgdrain import Budget, DrainResult, Job, Registry, Settings, enqueue
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.runner.abandoned import stale_threads
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]


class Gates:
    """A job kind whose attempt N starts, signals, and returns only when the test says so."""

    def __init__(self) -> None:
        self.started = {n: threading.Event() for n in (1, 2)}
        self.release = {n: threading.Event() for n in (1, 2)}
        self.tokens: dict[int, Any] = {}
        self.registry = Registry()
        self.registry.job("gate")(self._run)

    def _run(self, job: Job) -> None:
        self.tokens[job.attempt] = job.attempt_token
        self.started[job.attempt].set()
        assert self.release[job.attempt].wait(60), "the test never released this attempt"


def test_an_older_attempt_finishing_leaves_the_same_runs_newer_attempt_of_the_job_running(
    db_url: str, conn: Conn
) -> None:
    job_id = enqueue(conn, "gate")
    gates = Gates()
    lost = threading.Event()
    results: list[DrainResult] = []

    def observe(counter: str, n: int) -> None:
        if counter == "lease_lost":
            lost.set()

    # No heartbeat (the fault: a pause longer than the lease) and a 1 s lease, so attempt 1's
    # lease expires while it runs; the run wakes every lease/3 to claim what is ready.
    settings = Settings(lease_seconds=1, concurrency=2, batch_size=2)
    thread = threading.Thread(
        target=lambda: results.append(
            drain_with(
                Controls(heartbeat=False),
                settings,
                Budget.seconds(60),
                gates.registry,
                db_url,
                observer=observe,
            )
        ),
        daemon=True,
    )
    thread.start()
    assert gates.started[1].wait(30)
    # Another run reclaims the expired lease; this run then claims the job again (attempt 2)
    # while attempt 1 still runs in its thread.
    assert wait_for(lambda: store.job_reclaim_expired(conn, 10), what="expired lease")
    assert gates.started[2].wait(30)

    gates.release[1].set()  # attempt 1 returns: its result is refused by the fence
    assert lost.wait(30)
    gates.release[2].set()  # attempt 2 returns: its result must be recorded
    thread.join(60)
    [result] = results

    row = job_row(conn, job_id)
    assert (row["status"], row["completed_token"]) == ("done", gates.tokens[2])
    assert (result.claimed, result.done, result.lease_lost, result.abandoned) == (2, 1, 1, 0)


# -- item 3: a run that gives up on a running job, in a process that lives on (a warm container)


@pytest.mark.parametrize("marked", [True, False], ids=["marked-lost", "unmarked"])
# At concurrency 1 the job runs on the loop's own thread (one_slot.py) and the calling thread
# ends the run at the final margin: the same outcome as with worker threads.
@pytest.mark.parametrize("concurrency", [10, 1], ids=["worker-threads", "loop-thread"])
def test_a_job_the_run_gave_up_on_learns_it_at_once_and_the_next_run_counts_its_thread(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture, marked: bool, concurrency: int
) -> None:
    job_id = enqueue(conn, "gate")
    gates = Gates()
    seen: list[Job] = []
    gates.registry = Registry()

    @gates.registry.job("gate")
    def held(job: Job) -> None:
        seen.append(job)
        if job.attempt == 1:
            assert gates.release[1].wait(60)

    switches = Controls(mark_abandoned_lost=marked)
    settings = Settings(reserve_seconds=0.5, lease_seconds=30, concurrency=concurrency)
    # Threads other tests in this process abandoned (slow jobs) count too: compare with them.
    baseline = stale_threads()
    first = drain_with(switches, settings, Budget.seconds(2), gates.registry, db_url)
    assert (first.stop_reason, first.abandoned) == ("budget", 1)
    [attempt_1] = seen
    # The run has returned; the job's thread runs on in this process.
    assert attempt_1.lease_lost() is marked

    second = drain_with(switches, settings, Budget.seconds(5), gates.registry, db_url)
    assert second.stale_threads == baseline + (1 if marked else 0)
    assert second.claimed == 0  # its lease holds until the first run's deadline

    caplog.set_level(logging.WARNING, logger="pgdrain")
    gates.release[1].set()
    if marked:
        wait_for(
            lambda: any("abandoned attempt ended" in r.getMessage() for r in caplog.records),
            what="the late outcome to be logged",
        )
        # Once the lease has ended, the next run takes the job back and runs it again.
        wait_for(lambda: store.job_reclaim_expired(conn, 10), what="the lease to end")
        third = drain_with(switches, settings, Budget.seconds(10), gates.registry, db_url)
        assert (third.stale_threads, third.done) == (baseline, 1)
        row = job_row(conn, job_id)
        assert (row["status"], row["completed_token"]) == ("done", seen[-1].attempt_token)
        assert seen[-1].attempt == 2
