"""SIGTERM and SIGINT during `pgdrain drain` and `pgdrain invoke`: the run stops claiming,
gives running jobs a short grace, queues those still running again at once with their attempt
given back, prints its summary and exits 130/143, with no traceback.
The control is the hard kill (SIGKILL, or a Lambda timeout): nothing runs, and the jobs stay
held until their leases end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import ledger_jobs
from helpers.cli import ROOT
from helpers.fixtures import job_row, wait_for
from pgdrain import enqueue
from pgdrain.db import store

Conn = psycopg.Connection[Any]
TESTS = ROOT / "tests"


def start(command: str, url: str, tmp_path: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGDRAIN_", "POWERTOOLS_"))}
    env.update(
        {
            "DATABASE_URL": url,
            ledger_jobs.LEDGER_URL_VARIABLE: url,
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT / "handler")]),
        }
    )
    if command == "drain":
        env.update({"PGDRAIN_JOBS": "helpers.ledger_jobs", "PGDRAIN_CONCURRENCY": "1"})
        args = ["drain", "--budget", "120", "--json"]
    else:
        overrides = tmp_path / "env.json"
        overrides.write_text(
            json.dumps(
                {
                    "DrainFunction": {
                        "PGDRAIN_JOBS": "helpers.ledger_jobs",
                        "PGDRAIN_CONCURRENCY": "1",
                        # The template requires TLS; the test server has none.
                        "PGSSLMODE": "prefer",
                    }
                }
            )
        )
        args = ["invoke", "-e", "infra/events/schedule.json", "--env-vars", str(overrides)]
    return subprocess.Popen(
        [sys.executable, "-m", "pgdrain.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def started(conn: Conn) -> list[int]:
    rows = conn.execute("SELECT job_id FROM public.ledger WHERE phase = 'start'").fetchall()
    return [int(r[0]) for r in rows]


@pytest.mark.parametrize("command", ["drain", "invoke"])
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["TERM", "INT", "KILL"]
)
def test_a_signal_stops_the_run_and_gives_its_running_job_back_at_once(
    ledger_url: str, conn: Conn, tmp_path: Path, command: str, signum: int
) -> None:
    running = enqueue(conn, "slow", {"seconds": 60})  # outlives the grace
    waiting = enqueue(conn, "slow", {"seconds": 60}, priority=1)  # never claimed: one slot
    process = start(command, ledger_url, tmp_path)
    try:
        assert wait_for(lambda: started(conn), timeout=60, what="the job to start") == [running]
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()

    reclaimed = [r.id for r in store.job_reclaim_expired(conn, 10)]
    if signum == signal.SIGKILL:
        # The control: nothing ran after the kill, the job stays held by a dead run.
        assert process.returncode == -signal.SIGKILL
        assert reclaimed == []
    else:
        assert process.returncode == 128 + signum, err
        assert "Traceback" not in err
        said = [line for line in err.splitlines() if "no more claims" in line]
        assert len(said) == 1 and signal.Signals(signum).name in said[0]
        result = json.loads(out.strip().splitlines()[-1])
        summary = result if command == "drain" else result["result"]
        assert (summary["stop_reason"], summary["claimed"], summary["abandoned"]) == (
            "stopped",
            1,
            1,
        )
        # Queued again with the run's end, not a lease later, its attempt not counted.
        assert reclaimed == []
        assert job_row(conn, running)["status"] == "queued"
        assert job_row(conn, running)["attempts"] == 0
    row = conn.execute(
        "SELECT status, attempts FROM pgdrain.jobs WHERE id = %s", (waiting,)
    ).fetchone()
    assert row == ("queued", 0)
