"""The embedded test server (tests/conftest.py server_url), used when DATABASE_URL is unset:
when it dies the run says so once, with the tail of the server's log; its data directory is
its own and out of the way of other pytest sessions; two runs at once both pass. Each case
runs pytest in a process of its own, with DATABASE_URL unset."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import NO_WATCH_VARIABLE, EmbeddedServer

from helpers.cli import ROOT

VICTIM = "tests/acceptance/embedded_victim.py"
SUBSET = "tests/integration/test_queue_basics.py"
TIMEOUT_SECONDS = 300


def _pytest(*args: str, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and k != NO_WATCH_VARIABLE}
    clean.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = process.communicate(timeout=TIMEOUT_SECONDS)
    return process.returncode, out


def test_a_dead_embedded_server_is_reported_once_with_its_log() -> None:
    code, out = _finish(_pytest(VICTIM))
    assert code != 0, out
    assert out.count("the embedded PostgreSQL of this run died") == 1, out
    assert "received immediate shutdown request" in out, out  # from the server's own log
    assert "1 passed, 1 error" in out, out  # the run stopped at the first casualty


def test_control_without_the_watch_every_later_test_fails_to_connect() -> None:
    code, out = _finish(_pytest(VICTIM, **{NO_WATCH_VARIABLE: "1"}))
    assert code != 0, out
    assert "the embedded PostgreSQL of this run died" not in out
    assert "1 passed, 10 errors" in out, out


def test_two_runs_at_once_both_pass() -> None:
    """What `make test` twice at once does, on a subset: each run starts its own server."""
    runs = [_pytest(SUBSET), _pytest(SUBSET)]
    results = [_finish(run) for run in runs]
    for code, out in results:
        assert code == 0, out


@pytest.mark.skipif(os.geteuid() != 0, reason="pgserver runs the server as another user as root")
def test_control_a_data_directory_under_a_0700_folder_cannot_start(tmp_path: Path) -> None:
    """What the data directory under /tmp/pytest-of-<user> became when any other pytest session
    started (pytest resets that folder to 0700): the server's own user cannot reach it, and
    initdb fails. The same start in a folder directly under /tmp (the fixture's) works."""
    closed = Path(tempfile.mkdtemp(prefix="pgdrain-test-closed-"))
    try:
        inside = closed / "pg"
        inside.mkdir()
        server = EmbeddedServer(inside)
        with pytest.raises(Exception):  # noqa: B017 (pgserver raises CalledProcessError)
            # pgserver opens the path to the user; pytest closes it again, as here:
            _start_with_the_parent_closed(server, closed)
        assert any("initdb" in line or "Permission denied" in line for line in server.errors.lines)
    finally:
        subprocess.run(["rm", "-rf", str(closed)], check=False)
    ok = EmbeddedServer(Path(tempfile.mkdtemp(prefix="pgdrain-test-pg-")))
    try:
        ok.start()
        assert ok.alive()
    finally:
        ok.stop()


def _start_with_the_parent_closed(server: EmbeddedServer, parent: Path) -> None:
    """Start, with `parent` set back to 0700 as soon as pgserver has opened the path (the
    moment another pytest session would)."""
    import pgserver.postgres_server as module

    original = module.ensure_prefix_permissions

    def open_then_close(path: Path) -> None:
        original(path)
        parent.chmod(stat.S_IRWXU)

    module.ensure_prefix_permissions = open_then_close
    try:
        server.start()
    finally:
        module.ensure_prefix_permissions = original
