"""The tests' restartable server stops promptly though a client connected while it was shutting
down and never sent its first message (a drain connecting through a paused proxy, as in the
chaos soak). Such a connection is kept until the server has read that message or given up on
it (authentication_timeout), and a shutdown waits for it: at PostgreSQL's default of 60 s the
soak's restart failed its 60 s stop timeout.

Same timeline both times: a session keeps a smart shutdown waiting, a silent connection
arrives, the session ends, and a fast stop must finish within STOP_TIMEOUT_SECONDS. The one
variable is authentication_timeout: the helper's 5 s, or PostgreSQL's default."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from helpers import restartable_pg
from helpers.fixtures import wait_for
from helpers.restartable_pg import RestartableServer

pytestmark = pytest.mark.skipif(
    restartable_pg.available() is not None, reason=str(restartable_pg.available())
)

STOP_TIMEOUT_SECONDS = 10
POSTGRES_DEFAULT = "60s"


@contextmanager
def silent_connection_during_shutdown(server: RestartableServer) -> Iterator[None]:
    """A TCP connection made while the server is shutting down, that sends nothing; the
    session that held the shutdown back has ended when this yields."""
    session = psycopg.connect(server.url(), autocommit=True)
    server.begin_smart_shutdown()
    _wait_until_shutting_down(server)
    before = _server_children(server)
    with socket.create_connection(("127.0.0.1", server.port)):
        # The server has taken the connection when a process of its own serves it.
        wait_for(lambda: _server_children(server) - before, what="a server process for it")
        session.close()
        yield


def _wait_until_shutting_down(server: RestartableServer) -> None:
    def refused() -> bool:
        try:
            psycopg.connect(server.url(), connect_timeout=2).close()
        except psycopg.OperationalError as exc:
            return "shutting down" in str(exc)
        return False

    wait_for(refused, what="the server to say it is shutting down")


def _server_children(server: RestartableServer) -> set[int]:
    """The process ids of the server's children (from postmaster.pid and /proc)."""
    postmaster = (server.pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    children = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
        except OSError:  # the process ended while we looked
            continue
        if fields.get("PPid", "").strip() == postmaster:
            children.add(int(status.parent.name))
    return children


def test_a_silent_connection_does_not_hold_the_stop() -> None:
    with RestartableServer() as server, silent_connection_during_shutdown(server):
        server.stop("fast", timeout=STOP_TIMEOUT_SECONDS)  # raises past the timeout
        assert not server.is_running()


def test_control_at_postgres_default_the_silent_connection_holds_the_stop() -> None:
    with RestartableServer(authentication_timeout=POSTGRES_DEFAULT) as server:
        with silent_connection_during_shutdown(server):
            with pytest.raises(RuntimeError, match="fast stop failed"):
                server.stop("fast", timeout=STOP_TIMEOUT_SECONDS)
            assert server.is_running()
