"""Not collected by the suite (no test_ prefix): tests/acceptance/test_embedded_server.py runs
it in a pytest of its own, with no DATABASE_URL, so that it has an embedded server to kill.
The first test shuts that server down the way a crash or a stray `kill` would; the others
then need a database."""

from __future__ import annotations

import os
import signal

import psutil
import psycopg
import pytest


def test_the_server_is_killed(server_url: str) -> None:
    with psycopg.connect(server_url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        postmaster = psutil.Process(int(row[0])).ppid()  # while the backend lives
    os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown, as after a crash
    psutil.Process(postmaster).wait(timeout=30)


@pytest.mark.parametrize("n", range(10))
def test_needs_a_database(db_url: str, n: int) -> None:
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
