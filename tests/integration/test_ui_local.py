"""`pgdrain ui`'s local server (pgdrain.ui.local) as a client meets it: a connection left idle
(a browser opens sockets ahead) holds up no other request, a Content-Length that is no number
of bytes is refused at once, and on port 80 the Host a browser sends, without the port, is
answered. A red team's report found the first two hanging the server."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from helpers.fixtures import wait_for
from helpers.lock_waits import someone_here_waits_on_a_lock
from pgdrain import enqueue
from pgdrain.db import store
from pgdrain.ui import app as ui_app
from pgdrain.ui import csrf, local

Conn = psycopg.Connection[Any]


CONFIG = ui_app.UiConfig(actions=True, tokens=csrf.Tokens(os.urandom(32)))


def _connector(db_url: str) -> ui_app.Connect:
    @contextlib.contextmanager
    def connect() -> Iterator[store.Connection]:
        with psycopg.connect(db_url, autocommit=True) as conn:
            yield conn

    return connect


@contextlib.contextmanager
def _serving(build_app: Callable[[], Any]) -> Iterator[local.Server]:
    httpd = local.Server(build_app, 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def served(db_url: str) -> Iterator[local.Server]:
    with _serving(lambda: ui_app.build(_connector(db_url), CONFIG)) as httpd:
        yield httpd


def _get(httpd: local.Server, path: str, timeout: float = 10.0) -> int:
    port = httpd.server_address[1]
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        client.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        return client.getresponse().status
    finally:
        client.close()


def test_a_connection_left_idle_holds_up_no_other_request(served: local.Server) -> None:
    with socket.create_connection(("127.0.0.1", served.server_address[1])):  # sends nothing
        assert _get(served, "/control") == 200


@pytest.mark.parametrize("length", ["-1", "abc", "1" * 40])
def test_a_content_length_that_is_no_number_of_bytes_is_refused(
    served: local.Server, length: str
) -> None:
    port = served.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = f"POST /retry HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}"
        sock.sendall(f"{head}\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.0 400 ")


def test_on_port_80_the_host_without_its_port_is_answered() -> None:
    assert local.allowed_hosts(80) == {"127.0.0.1", "localhost", "127.0.0.1:80", "localhost:80"}
    assert local.allowed_hosts(8000) == {"127.0.0.1:8000", "localhost:8000"}


class _OneAtATime:
    """The control: one resolver for every request, answering one at a time (as before)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()

    def resolve(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        with self.lock:
            return dict(self.app.resolve(event, context))


@pytest.mark.parametrize("per_request", [True, False], ids=["per-request", "control-one-at-a-time"])
def test_an_action_waiting_on_a_locked_row_holds_up_no_other_request(
    db_url: str, conn: Conn, per_request: bool
) -> None:
    """A cancel waits on a job's row that a transaction left open holds (up to its bound,
    ACTION_LOCK_TIMEOUT_MS); meanwhile another tab's page is answered. The control serves
    every request through one resolver, one at a time: the page waits behind the cancel."""
    job_id = enqueue(conn, "k")
    connect = _connector(db_url)
    shared = _OneAtATime(ui_app.build(connect, CONFIG))
    build_app = (lambda: ui_app.build(connect, CONFIG)) if per_request else (lambda: shared)
    with _serving(build_app) as httpd, psycopg.connect(db_url) as holder:
        page = _request(httpd, "GET", f"/jobs/{job_id}")
        token = re.search(r'name="token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
        holder.execute("SELECT 1 FROM pgdrain.active_jobs WHERE id = %s FOR UPDATE", (job_id,))
        cancel = threading.Thread(
            target=_request,
            args=(httpd, "POST", f"/jobs/{job_id}/cancel", f"confirm=1&token={token}"),
        )
        cancel.start()
        wait_for(lambda: someone_here_waits_on_a_lock(conn), what="the cancel to wait on the row")
        if per_request:
            assert _get(httpd, "/") == 200
        else:
            with pytest.raises(TimeoutError):
                _get(httpd, "/", timeout=1.0)
        holder.rollback()
        cancel.join(30)
        assert not cancel.is_alive()


def _request(httpd: local.Server, method: str, path: str, form: str = "") -> str:
    port = httpd.server_address[1]
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}
    if form:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        client.request(method, path, body=form or None, headers=headers)
        return client.getresponse().read().decode()
    finally:
        client.close()
