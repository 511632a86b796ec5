"""`pgdrain ui` as a user runs it: it prints its URL, listens on 127.0.0.1 only, serves the
pages, and Ctrl-C stops it; a database without the schema, or a bad port, is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from helpers.cli import EXIT_BAD_INPUT, ROOT, TIMEOUT_SECONDS, run_pgdrain


def _env(url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")}
    return {**clean, "DATABASE_URL": url, "PYTHONPATH": str(ROOT / "handler")}


def _listening_addresses(port: int) -> set[str]:
    """The local addresses in LISTEN state on `port` (Linux /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":
                found.add(address)
    return found


def test_it_serves_on_127_0_0_1_and_stops_on_ctrl_c(db_url: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "pgdrain.cli", "ui", "--port", "0"],
        env=_env(db_url),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Started with SIGINT ignored, as a script's background job is: Ctrl-C must still stop
        # it (without its own handler it ignored the signal and this wait timed out).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        try:
            line = process.stdout.readline()
            assert line.startswith("pgdrain ui: http://127.0.0.1:"), line
            url = line.split()[2]
            port = int(url.rstrip("/").rsplit(":", 1)[1])
            assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, and nothing else
            with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
                assert answer.status == 200
                assert b"<h1>Queues</h1>" in answer.read()
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=TIMEOUT_SECONDS) == 0
        finally:
            if process.poll() is None:
                process.kill()
        assert "Traceback" not in process.stderr.read()


def test_a_database_without_the_schema_is_one_line(empty_db_url: str) -> None:
    run = run_pgdrain("ui", "--port", "0", env={"DATABASE_URL": empty_db_url})
    assert run.code == EXIT_BAD_INPUT  # the configuration points at the wrong database
    assert run.err.strip() == (
        "pgdrain: error: the database has no pgdrain schema: run `pgdrain migrate` first"
    )


def test_a_bad_port_is_bad_input(db_url: str) -> None:
    run = run_pgdrain("ui", "--port", "70000", env={"DATABASE_URL": db_url})
    assert run.code == EXIT_BAD_INPUT
    assert run.err.strip() == "pgdrain: error: argument --port: '70000' must be from 0 to 65535"
