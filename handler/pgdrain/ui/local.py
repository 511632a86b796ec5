"""`pgdrain ui`: the dashboard on 127.0.0.1, through the same resolver as on AWS. Each HTTP
request becomes the Function URL event Lambda would hand over (payload 2.0), and the
resolver's answer becomes the HTTP response: no second web stack."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import logging
import secrets
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast
from urllib.parse import urlsplit

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver
from aws_lambda_powertools.utilities.typing import LambdaContext

from pgdrain.budget import Budget
from pgdrain.db import connection, store
from pgdrain.errors import ConfigError
from pgdrain.settings import Settings
from pgdrain.ui.app import MAX_BODY_BYTES, UiConfig, build
from pgdrain.ui.csrf import Tokens

HOST = "127.0.0.1"  # never another interface
REQUEST_TIMEOUT_SECONDS = 30  # how long a connection may send nothing
DEFAULT_PORT = 8080


def to_event(
    method: str, target: str, headers: dict[str, str], body: bytes, client: str
) -> dict[str, Any]:
    """An HTTP request as a Lambda Function URL event (payload format 2.0)."""
    # A path, never a URL: urlsplit("//jobs") would read "jobs" as a host.
    parts = urlsplit("http://local" + target if target.startswith("/") else target)
    now = dt.datetime.now(dt.UTC)
    lowered = {k.lower(): v for k, v in headers.items()}
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": parts.path or "/",
        "rawQueryString": parts.query,
        "headers": lowered,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "local",
            "domainName": lowered.get("host", HOST),
            "domainPrefix": "local",
            "http": {
                "method": method,
                "path": parts.path or "/",
                "protocol": "HTTP/1.1",
                "sourceIp": client,
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "body": base64.b64encode(body).decode("ascii") if body else None,
        "isBase64Encoded": bool(body),
    }


class Server(http.server.ThreadingHTTPServer):
    """Serves the dashboard on 127.0.0.1, to requests addressed to 127.0.0.1 or localhost
    only. A thread per connection, and a resolver of its own per request (a resolver keeps the
    current request on itself; `build` takes a fraction of a millisecond): a connection left
    idle (a browser opens sockets ahead) or a request waiting on the database (a row locked
    elsewhere, a database gone) holds up no other."""

    daemon_threads = True

    def __init__(self, build_app: Callable[[], LambdaFunctionUrlResolver], port: int) -> None:
        super().__init__((HOST, port), _Handler)
        self.build_app = build_app
        self.allowed_hosts = allowed_hosts(self.server_address[1])


def allowed_hosts(port: int) -> frozenset[str]:
    """The Host headers the dashboard on `port` answers: 127.0.0.1 and localhost, with the
    port, or without it on 80 (a browser leaves out the scheme's own port)."""
    hosts = {f"{HOST}:{port}", f"localhost:{port}"}
    if port == 80:
        hosts |= {HOST, "localhost"}
    return frozenset(hosts)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Server
    server_version = "pgdrain-ui"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_SECONDS  # a connection that sends nothing is closed

    def do_GET(self) -> None:
        self._serve(b"")

    def do_POST(self) -> None:
        text = self.headers.get("Content-Length") or "0"
        if not (text.isascii() and text.isdigit()) or len(text) > 12:
            self._plain(400, "Content-Length is not a number of bytes")
            return
        if int(text) > MAX_BODY_BYTES:
            self._plain(413, "the form is too large")
            return
        self._serve(self.rfile.read(int(text)))

    def _serve(self, body: bytes) -> None:
        # A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) sends its own
        # Host: refused, so that it cannot read the dashboard.
        if (self.headers.get("Host") or "").lower() not in self.server.allowed_hosts:
            self._plain(421, "this dashboard answers to 127.0.0.1 and localhost only")
            return
        headers = dict(self.headers.items())
        event = to_event(self.command, self.path, headers, body, self.client_address[0])
        result = self.server.build_app().resolve(event, cast(LambdaContext, None))
        payload = result.get("body") or ""
        data = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode()
        self.send_response(int(result.get("statusCode", 200)))
        for name, value in (result.get("headers") or {}).items():
            self.send_header(name, value)
        for cookie in result.get("cookies") or ():
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _plain(self, status: int, message: str) -> None:
        data = (message + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request line may hold filters typed by the operator: not logged


def run(conninfo: str, settings: Settings, port: int, *, actions: bool) -> int:
    """`pgdrain ui`: check the database once (one error line if it cannot serve), then serve
    until Ctrl-C. Each request opens its own connection and closes it."""

    @contextlib.contextmanager
    def connect() -> Iterator[store.Connection]:
        budget = Budget.seconds(settings.connect_timeout)
        with connection.connect(conninfo, settings, budget, retry_log_level=logging.INFO) as conn:
            store.operator_session(conn)
            yield conn

    with connect() as conn:
        if not store.migration_ledger_exists(conn):
            raise ConfigError("the database has no pgdrain schema: run `pgdrain migrate` first")
    # Tokens are this process's own: a restarted `pgdrain ui` asks for a reload before acting.
    config = UiConfig(actions=actions, tokens=Tokens(secrets.token_bytes(32)))
    try:
        httpd = Server(lambda: build(connect, config), port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {HOST}:{port}: {exc.strerror}") from None
    # Ctrl-C stops it even when it was started with SIGINT ignored (a script's background job
    # is), and so does SIGTERM.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"pgdrain ui: http://{HOST}:{httpd.server_address[1]}/  (Ctrl-C stops)", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0
