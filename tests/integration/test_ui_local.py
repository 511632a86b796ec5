"""`pgdrain ui`'s local server (pgdrain.ui.local) as a client meets it: a connection left idle
(a browser opens sockets ahead) holds up no other request, a Content-Length that is no number
of bytes is refused at once, and on port 80 the Host a browser sends, without the port, is
answered. A red team's report found the first two hanging the server."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgdrain.db import store
from pgdrain.ui import app as ui_app
from pgdrain.ui import csrf, local

Conn = psycopg.Connection[Any]


@pytest.fixture
def served(db_url: str) -> Iterator[local.Server]:
    @contextlib.contextmanager
    def connect() -> Iterator[store.Connection]:
        with psycopg.connect(db_url, autocommit=True) as conn:
            yield conn

    config = ui_app.UiConfig(actions=True, tokens=csrf.Tokens(os.urandom(32)))
    httpd = local.Server(ui_app.build(connect, config), 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _get(httpd: local.Server, path: str) -> int:
    port = httpd.server_address[1]
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
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
