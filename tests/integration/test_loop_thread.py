"""At concurrency 1 the run's loop runs its one job on its own thread, and the calling thread
does the loop's duties while the job runs (runner/loop_thread.py). The heartbeat it sends
then is tested in test_drain_safety.py (its long-job test runs at concurrency 1), the final
margin in test_drain_attempts.py (the abandoned-job test, loop-thread)."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
import pytest

from helpers.fixtures import db_now, job_row
from pgdrain import Budget, DrainResult, Job, Registry, Settings, drain, enqueue
from pgdrain.controls import Controls
from pgdrain.db.session import Session
from pgdrain.runner.drain import drain_with
from pgdrain.runner.stop import StopRequest
from pgdrain.runner.summary import Counter

Conn = psycopg.Connection[Any]
drain_module = importlib.import_module(
    "pgdrain.runner.drain"
)  # `pgdrain.runner.drain` is the function
ONE_SLOT = Settings(concurrency=1, batch_size=1)


@pytest.mark.parametrize("one_thread", [True, False], ids=["loop-thread", "worker-thread"])
def test_at_concurrency_1_no_job_runs_on_the_calling_thread(
    db_url: str, conn: Conn, one_thread: bool
) -> None:
    """The handler must be free to return at its deadline whatever a job does: the loop's own
    thread runs them (one thread for the whole run), as a worker thread does otherwise."""
    registry = Registry()
    threads: list[threading.Thread] = []

    @registry.job("where")
    def where(job: Job) -> None:
        threads.append(threading.current_thread())

    for _ in range(3):
        enqueue(conn, "where")
    result = drain_with(
        Controls(job_on_loop_thread=one_thread), ONE_SLOT, Budget.seconds(30), registry, db_url
    )
    assert result.done == 3
    assert threading.current_thread() not in threads
    assert len(set(threads)) == 1
    assert threads[0].name.startswith("pgdrain-job")


@pytest.mark.parametrize("ends", [True, False], ids=["thread-ends", "control-goes-on"])
def test_a_stop_that_ends_the_run_while_its_one_job_runs_leaves_its_thread_nothing_to_write(
    db_url: str, conn: Conn, ends: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop's grace ends while the job still runs: the calling thread ends the job's lease and
    returns. When the job then returns, its thread (the loop's) must touch nothing of the run
    (nor let go of it again): the job stays reclaimable, to run again. The control lets that
    thread go on with the loop: it reconnects and records the job done after its run had
    returned it as abandoned."""
    let_go_by: list[threading.Thread] = []
    let_go = drain_module._Run.let_go

    def noting_who_lets_go(run: Any, pool: Any) -> None:
        let_go_by.append(threading.current_thread())
        let_go(run, pool)

    monkeypatch.setattr(drain_module._Run, "let_go", noting_who_lets_go)
    registry = Registry()
    started, release = threading.Event(), threading.Event()
    job_threads: list[threading.Thread] = []

    @registry.job("gate")
    def gate(job: Job) -> None:
        job_threads.append(threading.current_thread())
        started.set()
        assert release.wait(60), "the test never released the job"

    job_id = enqueue(conn, "gate")
    stop = StopRequest(grace_seconds=0.2)
    results: list[DrainResult] = []
    # The stop ends the job's lease rather than queueing it again (its attempt given back), so
    # that the control's late completion still finds the attempt's token to write under.
    switches = Controls(
        end_the_loop_thread_with_the_run=ends, give_back_attempts_a_stop_cuts_short=False
    )
    run = threading.Thread(
        target=lambda: results.append(
            drain_with(switches, ONE_SLOT, Budget.seconds(60), registry, db_url, stop=stop)
        ),
        daemon=True,
    )
    run.start()
    assert started.wait(30)
    stop.request()
    run.join(30)
    assert not run.is_alive(), "the run must return while its job still runs"
    [result] = results
    assert (result.stop_reason, result.abandoned, result.done) == ("stopped", 1, 0)
    row = job_row(conn, job_id)
    assert row["status"] == "running"
    assert row["lease_expires_at"] <= db_now(conn)  # ended at the grace: reclaimable now

    release.set()
    [loop_thread] = job_threads
    loop_thread.join(30)
    assert not loop_thread.is_alive()
    row = job_row(conn, job_id)
    if ends:
        assert (row["status"], row["completed_token"]) == ("running", None)
        assert let_go_by == [run]  # the calling thread's, once
    else:
        assert row["status"] == "done"  # written by a run that had already returned
        assert let_go_by == [run, loop_thread]


class _FailingHook:
    def after_connect(self, session: Session) -> bool:
        return True

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        raise RuntimeError("a bug in a hook")

    def before_exit(self, session: Session) -> bool:
        return False


def test_an_error_in_the_loops_thread_is_raised_by_the_drain_call(db_url: str, conn: Conn) -> None:
    """Not a database error (those end the run with stop_reason "error"): a bug, raised to the
    caller as it would be with the loop on the calling thread; the job claimed never starts."""
    registry = Registry()
    ran: list[int] = []

    @registry.job("noop")
    def noop(job: Job) -> None:
        ran.append(job.id)

    job_id = enqueue(conn, "noop")
    with pytest.raises(RuntimeError, match="a bug in a hook"):
        drain(ONE_SLOT, Budget.seconds(30), registry, db_url, hooks=_FailingHook())
    assert ran == []
    assert job_row(conn, job_id)["status"] == "running"  # its lease ends at the deadline
