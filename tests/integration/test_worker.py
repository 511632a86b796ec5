"""`pgdrain worker` (pgdrain.runner.worker), run in a thread of the test: it drains when kicked
(LISTEN pgdrain_kick), also for a kick sent while it was not waiting, at the next due moment
(a retry), and again once its listening connection is back. The control is the worker without
LISTEN: the same kick wakes nothing, and the job waits for the safety net.

Each drain is reported with what woke the worker, so the tests assert on that, not on timing:
a kicked job runs in a drain woken by the kick, well before the safety net."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers import worker_jobs
from helpers.cli import ROOT
from helpers.fixtures import wait_for
from helpers.history import day_partition_exists, make_day_partition
from helpers.lossy_proxy import LossyProxy
from pgdrain import Settings, enqueue
from pgdrain.aws.kick import kick
from pgdrain.controls import ALL_ON, Controls
from pgdrain.runner.stop import StopRequest
from pgdrain.runner.summary import DrainResult
from pgdrain.runner.worker import Worker, WorkerSummary

Conn = psycopg.Connection[Any]
SAFETY_NET_SECONDS = 6.0  # the control's job runs then; a kicked one long before
EVENT_TIMEOUT = 30.0
SETTINGS = Settings(schedule_rate_seconds=SAFETY_NET_SECONDS, reserve_seconds=0.5)
KICK_SETTINGS = Settings(kick="worker")


class Running:
    """A worker in a thread: each drain it reports, as (what woke it, its result)."""

    def __init__(self) -> None:
        self.drains: queue.Queue[tuple[str, DrainResult]] = queue.Queue()
        self.on_drain: Callable[[str, DrainResult], None] = lambda _why, _result: None
        self.summary: WorkerSummary | None = None

    def report(self, result: DrainResult, reason: str) -> None:
        self.on_drain(reason, result)
        self.drains.put((reason, result))

    def next_drain(self) -> tuple[str, DrainResult]:
        return self.drains.get(timeout=EVENT_TIMEOUT)


@contextmanager
def running_worker(
    url: str, controls: Controls = ALL_ON, settings: Settings = SETTINGS
) -> Iterator[Running]:
    stop = StopRequest(grace_seconds=2.0)
    running = Running()
    worker = Worker(
        settings, worker_jobs.jobs, url, stop=stop, controls=controls, report=running.report
    )
    errors: list[BaseException] = []

    def main() -> None:
        try:
            running.summary = worker.run()
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=main, name="worker", daemon=True)
    thread.start()
    try:
        yield running
    finally:
        stop.request()
        thread.join(timeout=EVENT_TIMEOUT)
    assert not thread.is_alive(), "the worker did not return after its stop"
    assert errors == []


def status(conn: Conn, job_id: int) -> tuple[str, int]:
    row = conn.execute("SELECT status, attempts FROM pgdrain.jobs WHERE id = %s", (job_id,))
    found = row.fetchone()
    assert found is not None
    return str(found[0]), int(found[1])


def enqueue_and_kick(conn: Conn) -> tuple[int, tuple[str, ...]]:
    with conn.transaction():
        job_id = enqueue(conn, "ok", {})
    return job_id, kick(conn, ["default"], settings=KICK_SETTINGS)


@pytest.mark.parametrize(
    ("listen", "woken_by"), [(True, "kick"), (False, "safety net")], ids=["listen", "control"]
)
def test_a_kick_wakes_an_idle_worker_and_its_job_runs(
    db_url: str, conn: Conn, listen: bool, woken_by: str
) -> None:
    with running_worker(db_url, Controls(listen_for_kicks=listen)) as worker:
        assert worker.next_drain()[0] == "start"  # nothing to do: it waits now
        job_id, heard = enqueue_and_kick(conn)
        assert heard == ("default",)  # a worker is connected (with or without its LISTEN)
        reason, result = worker.next_drain()
    assert (reason, result.claimed, result.done) == (woken_by, 1, 1)
    assert status(conn, job_id) == ("done", 1)


@pytest.mark.parametrize(
    ("listen", "woken_by"), [(True, "kick"), (False, "safety net")], ids=["listen", "control"]
)
def test_a_kick_sent_after_a_drain_and_before_the_wait_is_not_lost(
    db_url: str, conn: Conn, listen: bool, woken_by: str
) -> None:
    """The kick comes after the drain's last claim and exit check, before the worker waits
    (from the report, which the worker calls in between): it waits on the connection."""
    kicked: list[int] = []

    def kick_once(reason: str, _result: DrainResult) -> None:
        if not kicked:
            kicked.append(enqueue_and_kick(conn)[0])

    with running_worker(db_url, Controls(listen_for_kicks=listen)) as worker:
        worker.on_drain = kick_once
        assert worker.next_drain()[0] == "start"
        reason, result = worker.next_drain()
    assert (reason, result.claimed) == (woken_by, 1)
    assert status(conn, kicked[0]) == ("done", 1)


def test_a_retry_wakes_the_worker_when_it_falls_due_and_nothing_polls_before(
    db_url: str, conn: Conn
) -> None:
    job_id = enqueue(conn, "retry_once", {})
    with running_worker(db_url) as worker:
        first = worker.next_drain()
        second = worker.next_drain()
    assert (first[0], first[1].claimed, first[1].retried) == ("start", 1, 1)
    assert (second[0], second[1].claimed, second[1].done) == ("due", 1, 1)
    assert status(conn, job_id) == ("done", 2)
    assert worker.summary is not None and worker.summary.drains == 2  # none in between


def test_after_its_listening_connection_is_cut_the_worker_drains_what_it_missed(
    db_url: str, conn: Conn, proxy: LossyProxy
) -> None:
    with running_worker(proxy.url) as worker:
        assert worker.next_drain()[0] == "start"
        proxy.refuse()  # the database went away: the LISTEN with it
        with conn.transaction():
            job_id = enqueue(conn, "ok", {})  # its kick could reach no worker
        proxy.accept()
        reason, result = worker.next_drain()
    assert (reason, result.claimed) == ("reconnect", 1)
    assert status(conn, job_id) == ("done", 1)


def test_a_stop_while_idle_ends_the_wait_at_once(db_url: str) -> None:
    settings = dataclasses.replace(SETTINGS, schedule_rate_seconds=3600.0)
    with running_worker(db_url, settings=settings) as worker:
        assert worker.next_drain()[0] == "start"
    # running_worker's exit requested the stop and joined the thread: it returned.
    assert worker.summary is not None and worker.summary.drains == 1


def test_a_stop_while_the_database_is_down_ends_the_worker(db_url: str, proxy: LossyProxy) -> None:
    with running_worker(proxy.url) as worker:
        assert worker.next_drain()[0] == "start"
        proxy.refuse()  # the worker tries to connect again and again, until the stop
        wait_for(lambda: proxy.refused >= 2, timeout=EVENT_TIMEOUT, what="a retried connect")
    # running_worker's exit requested the stop and joined the thread: it returned.
    assert worker.summary is not None and worker.summary.drains == 1


# -- the history: retention, as the function's scheduled runs keep it ----------------------------


def _finished(conn: Conn, status: str, days_ago: float) -> int:
    """A job that ended `status` `days_ago` days ago (it moves to finished_jobs)."""
    job_id = enqueue(conn, "ok", {})
    conn.execute(
        "UPDATE pgdrain.jobs SET status = %s, attempts = 1,"
        " finished_at = now() - %s * interval '1 day' WHERE id = %s",
        (status, days_ago, job_id),
    )
    return job_id


@pytest.mark.parametrize("retain_days", [7.0, 36500.0], ids=["retention", "control-kept-for-ever"])
def test_a_worker_keeps_the_history_as_the_functions_scheduled_runs_do(
    db_url: str, conn: Conn, retain_days: float
) -> None:
    """Was: a worker deleted nothing and made no partition, so one running for weeks kept
    every finished job, and its done jobs went to the default partition once the days made by
    `pgdrain migrate` ran out. Now its first drain is followed by retention: a day partition
    past its age dropped, old failed jobs deleted, the days ahead made. The control keeps
    everything for a hundred years: the same worker deletes nothing."""
    make_day_partition(conn, -10)
    row = conn.execute(
        "SELECT 'finished_jobs_' || to_char((now() AT TIME ZONE 'UTC')::date + 2, 'YYYYMMDD')"
    )
    in_two_days = sql.Identifier("pgdrain", str(row.fetchone()[0]))  # type: ignore[index]
    # As if `pgdrain migrate` last ran three days ago: the day after tomorrow's is not made yet.
    conn.execute(
        sql.SQL("ALTER TABLE pgdrain.finished_jobs_done DETACH PARTITION {}").format(in_two_days)
    )
    conn.execute(sql.SQL("DROP TABLE {}").format(in_two_days))
    old_done, young_done = _finished(conn, "done", 10), _finished(conn, "done", 1)
    old_failed = _finished(conn, "failed", 40)
    settings = dataclasses.replace(
        SETTINGS, retain_done_days=retain_days, retain_failed_days=retain_days
    )

    with running_worker(db_url, settings=settings) as worker:
        assert worker.next_drain()[0] == "start"  # reported once retention has run
        ids = {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")}
        old_day, *ahead = [day_partition_exists(conn, day) for day in (-10, 0, 1, 2)]

    assert young_done in ids
    if retain_days < 10:
        assert (old_done in ids, old_failed in ids, old_day) == (False, False, False)
    else:
        assert (old_done in ids, old_failed in ids, old_day) == (True, True, True)
    assert ahead == [True, True, True]


def test_a_kicked_worker_keeps_the_history_once_per_safety_net_interval(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Kicks wake a busy worker again and again: retention follows its first drain, then waits
    for the safety net's interval (an hour here), whatever woke the drains in between."""
    settings = dataclasses.replace(SETTINGS, schedule_rate_seconds=3600.0)
    with caplog.at_level(logging.INFO, logger="pgdrain.runner.worker"):
        with running_worker(db_url, settings=settings) as worker:
            assert worker.next_drain()[0] == "start"
            for _ in range(2):
                enqueue_and_kick(conn)
                assert worker.next_drain()[0] == "kick"
    kept = [r for r in caplog.records if r.getMessage() == "retention deleted finished jobs"]
    assert len(kept) == 1


# A worker in the main thread of a process of its own (only there do signals reach Python),
# idle, waiting for the safety net. A thread of the process waits until the main thread sleeps
# in the idle wait's select (its Python frame is Listener._select, /proc says it is in the
# select system call), then sends SIGINT to itself: a signal the system handed to a thread
# other than the main one, as systems other than Linux may. Prints the worker's summary and
# whether it stopped at once: within half the wait, which the control sleeps out.
_SIGNAL_TO_ANOTHER_THREAD = """
import json, signal, sys, threading, time

from helpers import worker_jobs
from pgdrain import Settings
from pgdrain.controls import Controls
from pgdrain.runner.stop import StopRequest, stop_on_signals
from pgdrain.runner.worker import Listener, Worker

url, wakes, wait_s = sys.argv[1], sys.argv[2] == "wake", float(sys.argv[3])
main = threading.main_thread()
main_tid = threading.get_native_id()
SELECT_CALLS = {"23", "270"}  # select, pselect6 (x86_64)


def in_the_idle_wait() -> bool:
    frame = sys._current_frames().get(main.ident)
    if frame is None or frame.f_code is not Listener._select.__code__:
        return False
    with open(f"/proc/self/task/{main_tid}/syscall") as call:
        in_select = call.read().split()[0] in SELECT_CALLS
    frame = sys._current_frames().get(main.ident)
    return in_select and frame is not None and frame.f_code is Listener._select.__code__


shot: list[float] = []


def shoot() -> None:
    while not in_the_idle_wait():
        time.sleep(0.01)
    shot.append(time.monotonic())
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


settings = Settings(schedule_rate_seconds=wait_s, reserve_seconds=0.5)
controls = Controls(wake_the_wait_on_a_signal_to_any_thread=wakes)
threading.Thread(target=shoot, daemon=True).start()
with stop_on_signals(StopRequest(0.5)) as stop:
    summary = Worker(settings, worker_jobs.jobs, url, stop=stop, controls=controls).run()
waited = time.monotonic() - shot[0]
print(json.dumps({"drains": summary.drains, "signal": stop.signal_name,
                  "at_once": waited < wait_s / 2}))
"""


@pytest.mark.parametrize("wakes", [True, False], ids=["wakes", "control: waits it out"])
def test_a_signal_handed_to_another_thread_ends_the_idle_wait_at_once(
    db_url: str, wakes: bool
) -> None:
    """The control waits for the safety net (WAIT_S) before it sees the stop; the worker with
    the wake pipe as the signal's wake-up fd stops at once."""
    wait_s = 8.0
    command = [
        sys.executable,
        "-c",
        _SIGNAL_TO_ANOTHER_THREAD,
        db_url,
        "wake" if wakes else "control",
        str(wait_s),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("handler", "tests"))}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"drains": 1, "signal": "SIGINT", "at_once": wakes}
