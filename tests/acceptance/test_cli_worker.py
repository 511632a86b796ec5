"""`pgdrain worker` in a process of its own, as a user runs it: it runs a delayed job at its
time and a kicked job at once, and nothing in between; SIGINT and SIGTERM stop it cleanly
(exit 0, the running job finished within the grace, the one that outlasts it reclaimable at
once, the unclaimed one untouched; the control is SIGKILL); idle, it sends the database
nothing at all (counted by a proxy in front of it; the control: a kick, which it does see)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.cli import ROOT, run_pgdrain
from helpers.fixtures import wait_for
from helpers.lossy_proxy import LossyProxy
from pgdrain import Settings, enqueue
from pgdrain.aws.kick import kick
from pgdrain.db import store

Conn = psycopg.Connection[Any]
TIMEOUT = 30.0
IDLE_SECONDS = 5.0  # the window an idle worker must send nothing in


class WorkerProcess:
    """`pgdrain worker --json` and the JSON objects it prints, as they come."""

    def __init__(self, url: str, *args: str, env: dict[str, str] | None = None) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("PGDRAIN_", "AWS_"))}
        clean.update(
            {
                "DATABASE_URL": url,
                "PGDRAIN_JOBS": "helpers.worker_jobs",
                # A worker that hangs is told where: SIGABRT prints every thread's stack.
                "PYTHONFAULTHANDLER": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "handler")]),
                **(env or {}),
            }
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pgdrain.cli", "worker", "--json", *args],
            env=clean,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # stderr is read as it comes too: a pipe nobody reads fills (64 KiB), and a worker
        # whose log line cannot be written waits for ever, a stop included.
        self._stderr: list[str] = []
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait(timeout=TIMEOUT)
        self._reader.join(timeout=TIMEOUT)
        self._err_reader.join(timeout=TIMEOUT)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.put(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._stderr.append(line)

    def next_event(self) -> dict[str, Any]:
        try:
            return self.events.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError("the worker printed nothing more") from None

    def stop(self, signum: int) -> tuple[int, str]:
        """Send `signum`; the exit code and what it wrote to stderr, once it has exited."""
        self.process.send_signal(signum)
        try:
            self.process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(timeout=TIMEOUT)
            self._err_reader.join(timeout=TIMEOUT)
            stacks = "".join(self._stderr)
            raise AssertionError(f"the worker did not exit after {signum!r}:\n{stacks}") from None
        self._reader.join(timeout=TIMEOUT)
        self._err_reader.join(timeout=TIMEOUT)
        return self.process.returncode, "".join(self._stderr)


def status(conn: Conn, job_id: int) -> tuple[str, int]:
    row = conn.execute("SELECT status, attempts FROM pgdrain.jobs WHERE id = %s", (job_id,))
    found = row.fetchone()
    assert found is not None
    return str(found[0]), int(found[1])


def test_the_worker_runs_a_delayed_job_at_its_time_and_a_kicked_one_at_once(
    db_url: str, conn: Conn
) -> None:
    def enqueue_and_kick(delay: float) -> int:
        with conn.transaction():
            job_id = enqueue(conn, "ok", {}, delay=delay)
        assert kick(conn, ["default"], settings=Settings(kick="worker")) == ("default",)
        return job_id

    with WorkerProcess(db_url) as worker:
        start = worker.next_event()
        delayed = enqueue_and_kick(2.0)
        kicked_early = worker.next_event()  # nothing ready yet: it learns when the job is due
        due = worker.next_event()  # at the job's time, with no kick and no drain in between
        kicked = enqueue_and_kick(0)
        woken = worker.next_event()
        code, err = worker.stop(signal.SIGINT)
        stopped = worker.next_event()

    assert (start["woken_by"], start["claimed"]) == ("start", 0)
    assert (kicked_early["woken_by"], kicked_early["claimed"]) == ("kick", 0)
    assert (due["woken_by"], due["claimed"], due["done"]) == ("due", 1, 1)
    assert (woken["woken_by"], woken["claimed"], woken["done"]) == ("kick", 1, 1)
    assert status(conn, delayed) == status(conn, kicked) == ("done", 1)
    assert code == 0, err
    assert (stopped["event"], stopped["signal"], stopped["drains"]) == ("stopped", "SIGINT", 4)


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["INT", "TERM", "KILL"]
)
def test_a_signal_stops_the_worker_and_no_job_is_lost_or_stuck(
    db_url: str, conn: Conn, tmp_path: Path, signum: int
) -> None:
    def sleeper(name: str, seconds: float) -> int:
        started = str(tmp_path / name)
        return enqueue(conn, "sleep", {"seconds": seconds, "started": started})

    finishes = sleeper("finishes", 2.0)  # within the grace
    outlasts = sleeper("outlasts", 60.0)  # past it
    waiting = enqueue(conn, "ok", {}, priority=1)  # two slots: never claimed
    with WorkerProcess(db_url, "--concurrency", "2", "--batch-size", "2", "--grace", "4") as worker:
        wait_for(
            lambda: (tmp_path / "finishes").exists() and (tmp_path / "outlasts").exists(),
            timeout=TIMEOUT,
            what="both jobs to start",
        )
        code, err = worker.stop(signum)
        events = [] if signum == signal.SIGKILL else [worker.next_event(), worker.next_event()]
    reclaimed = [r.id for r in store.job_reclaim_expired(conn, 10)]

    if signum == signal.SIGKILL:
        # The control: nothing ran after the kill; the jobs stay held until their leases end.
        assert code == -signal.SIGKILL
        assert reclaimed == []
        assert status(conn, finishes) == ("running", 1)
    else:
        assert code == 0, err
        assert "Traceback" not in err
        said = [line for line in err.splitlines() if "no more claims" in line]
        assert len(said) == 1 and signal.Signals(signum).name in said[0]
        assert status(conn, finishes) == ("done", 1)
        # Queued again with the stop, not a lease later, its attempt not counted.
        assert (reclaimed, status(conn, outlasts)) == ([], ("queued", 0))
        assert [e["event"] for e in events] == ["drain", "stopped"]
        assert (events[0]["stop_reason"], events[0]["abandoned"]) == ("stopped", 1)
    assert status(conn, waiting) == ("queued", 0)


def test_an_idle_worker_sends_the_database_nothing(
    db_url: str, conn: Conn, proxy: LossyProxy
) -> None:
    with WorkerProcess(proxy.url) as worker:
        assert worker.next_event()["woken_by"] == "start"
        wait_for(lambda: proxy.open_links() == 1, timeout=TIMEOUT, what="the drain to close")
        before = (proxy.sent_bytes, proxy.connections)
        time.sleep(IDLE_SECONDS)  # an observation window, not a wait for something to happen
        idle = (proxy.sent_bytes, proxy.connections)

        # The control: the same count sees a kick's drain (its connection and statements).
        with conn.transaction():
            enqueue(conn, "ok", {})
        kick(conn, ["default"], settings=Settings(kick="worker"))
        assert worker.next_event()["claimed"] == 1
        woken = (proxy.sent_bytes, proxy.connections)
        code, err = worker.stop(signal.SIGTERM)

    assert idle == before, "the idle worker sent something"
    assert woken[0] > idle[0] and woken[1] == idle[1] + 1
    assert code == 0, err


def test_the_worker_refuses_a_transaction_pooler(db_url: str) -> None:
    done = run_pgdrain("worker", env={"DATABASE_URL": db_url, "PGDRAIN_POOLER": "transaction"})
    assert done.code == 2
    assert done.err.strip().startswith("pgdrain: error: pgdrain worker LISTENs for kicks")
    assert len(done.err.strip().splitlines()) == 1


def test_a_worker_of_some_queues_says_what_it_leaves_and_what_it_is_kicked_for(
    db_url: str, conn: Conn
) -> None:
    """A red team's report: `pgdrain worker --queues default` printed nothing of the ready job
    it left in `emails` (its text output showed only drains that claimed), and a kick for
    `emails` was dropped without a word. Now its first drain's line names the queue it leaves,
    and the kick is said, once."""
    with conn.transaction():
        job_id = enqueue(conn, "ok", {}, queue="emails")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGDRAIN_", "AWS_"))}
    env.update(
        {
            "DATABASE_URL": db_url,
            "PGDRAIN_JOBS": "helpers.worker_jobs",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "handler")]),
        }
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "pgdrain.cli", "worker", "--queues", "default"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda p=pipe, into=into: into.extend(p), daemon=True)
        for pipe, into in ((process.stdout, out), (process.stderr, err))
    ]
    for reader in readers:
        reader.start()
    try:
        wait_for(lambda: any("emails (1 ready)" in line for line in out), what="the unserved line")
        for _ in range(2):  # said once however often kicked
            assert kick(conn, ["emails"], settings=Settings(kick="worker")) == ("emails",)
        said = "kicked for emails, which this worker does not serve (default)"
        wait_for(lambda: any(said in line for line in err), what="the kick to be said")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=TIMEOUT) == 0
    finally:
        process.kill()
        process.wait(timeout=TIMEOUT)
        for reader in readers:
            reader.join(timeout=TIMEOUT)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    assert sum(said in line for line in err) == 1, err
    assert out[0].startswith("start: claimed 0"), out
    assert status(conn, job_id) == ("queued", 0)
