"""A job that forks and lets its child return (a red team's finding): the child held a copy of
the run, took the jobs waiting in its memory and ran them a second time, then waited forever
for work, deaf to SIGTERM. `pgdrain drain` in a fresh process, as a user runs it; the control
is the same command without the child's end (forks_unguarded)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.cli import EXIT_OK, ROOT, TIMEOUT_SECONDS
from pgdrain import enqueue

Conn = psycopg.Connection[Any]
HERE = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    """Running, not ended (a zombie waiting for its parent to read its status has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("ended", [True, False], ids=["child-ends", "control-unguarded"])
def test_a_forked_child_that_returns_ends_and_runs_nothing(
    db_url: str, conn: Conn, tmp_path: Path, ended: bool
) -> None:
    log, started = tmp_path / "ran.log", tmp_path / "started"
    enqueue(conn, "fork", {"started": str(started)})
    work = [enqueue(conn, "work", {"started": str(started)}) for _ in range(3)]
    env = {
        "DATABASE_URL": db_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(HERE), str(ROOT / "tests")]),
        "PGDRAIN_JOBS": "fork_jobs",
        "PGDRAIN_CONCURRENCY": "2",  # the fork beside one work job at a time
        "FORK_LOG": str(log),
    }
    module = "pgdrain.cli" if ended else "forks_unguarded"
    out, err = tmp_path / "out", tmp_path / "err"
    # Into files, not pipes: a child left alive holds a pipe open, and reading it would wait.
    with out.open("wb") as stdout, err.open("wb") as stderr:
        drain = subprocess.Popen(
            [sys.executable, "-m", module, "drain", "--budget", "60"],
            env={k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")} | env,
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )
        assert drain.wait(TIMEOUT_SECONDS) == EXIT_OK, err.read_text(encoding="utf-8")
    lines = [line.split() for line in log.read_text(encoding="utf-8").splitlines()]
    [child] = [int(line[-1]) for line in lines if line[0] == "child"]
    ran = Counter(int(line[1]) for line in lines if line[0] == "work")
    try:
        if ended:
            assert not _alive(child)
            assert ran == Counter(dict.fromkeys(work, 1))  # each once, none in the child
            assert "a process a job forked returned into the run" in err.read_text(encoding="utf-8")
        else:
            # Waits for work forever; a job waiting in memory when it forked (claimed ahead)
            # would have run again in it.
            assert _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
