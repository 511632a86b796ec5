"""A loopback TCP proxy in front of the test's PostgreSQL that can lose a reply on purpose.

`drop_commit_reply(marker)`: the next transaction whose statement contains `marker` is
forwarded whole, its COMMIT (or the Sync that ends a statement sent alone) too; the proxy
waits until the server has answered the COMMIT
(so the transaction is committed), then closes both sides without passing the answer on. The
client sees its connection break with no way to know whether its work committed: the lost
reply of a network fault or a failover, reproduced at one exact point, with no sleeps.

`pause()` / `resume()`: while paused, nothing is passed on in either direction (a stalled
network); the bytes wait and flow again on resume.

`refuse()` / `accept()`: while refusing, existing connections are cut and new ones closed at
once (a database that went away); `accept()` lets them through again.

`sent_bytes`, `connections`, `refused` and `open_links()`: what clients sent, and how many
connections they made, were refused, and hold (a client that sends nothing costs the server
no statement).

Listens on 127.0.0.1 only."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import psycopg

READY_FOR_QUERY_IDLE = b"Z\x00\x00\x00\x05I"  # the server's answer to a COMMIT ends with this
# The end of a request: a statement sent alone (no BEGIN) commits there, its implicit
# transaction ending (session.py sends the drain's one-statement operations so).
SYNC = b"S\x00\x00\x00\x04"
# A claim: the name its statement is prepared and bound under (db/pipeline.py).
CLAIM = b"pgdrain_job_complete_and_claim_"


class _Link:
    """One client connection and its server connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.state = "forward"  # -> "marked" (statement seen) -> "committing" (COMMIT sent)
        self.held = b""
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class LossyProxy:
    def __init__(self, url: str) -> None:
        params = psycopg.conninfo.conninfo_to_dict(url)
        self._params: dict[str, Any] = dict(params)
        host = str(params.get("host") or "127.0.0.1")
        port = int(params.get("port") or 5432)
        self._target: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._marker: bytes | None = None
        self._refusing = False
        self.dropped = threading.Event()  # set once a reply was lost
        self.drops = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self.connections = 0
        self.sent_bytes = 0  # client to server, in all
        self.refused = 0  # connections closed at once while refusing
        self._closed = False
        threading.Thread(target=self._accept, name="lossy-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        params = {**self._params, "host": "127.0.0.1", "port": str(self.port)}
        params["sslmode"] = "disable"  # the proxy reads the protocol: no TLS through it
        return psycopg.conninfo.make_conninfo(**params)

    def drop_commit_reply(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker
            self.dropped.clear()

    def armed(self) -> bool:
        with self._lock:
            return self._marker is not None

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
            links, self._links = self._links, []
        for link in links:
            link.close()

    def accept(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self._listener.close()
        self.refuse()

    def open_links(self) -> int:
        """Client connections that are open (their client has not closed them)."""
        with self._lock:
            return sum(1 for link in self._links if not link.closed)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                client.close()
                with self._lock:
                    self.refused += 1
                continue
            server = socket.socket(self._target[0], socket.SOCK_STREAM)
            try:
                server.connect(self._target[1])
            except OSError:
                client.close()
                server.close()
                continue
            # As libpq and PgBouncer do: a pipelined request goes out in one segment at once,
            # not held back by Nagle's algorithm until the previous one is acknowledged.
            for sock in (client, server):
                if sock.family == socket.AF_INET:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
                self.connections += 1
            threading.Thread(target=self._upstream, args=(link,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), daemon=True).start()

    def _upstream(self, link: _Link) -> None:
        """Client to server: watch for the marked statement, then for its COMMIT."""
        tail = b""
        while True:
            try:
                data = link.client.recv(65536)
            except OSError:
                data = b""
            if not data:
                link.close()
                return
            with self._lock:
                self.sent_bytes += len(data)
                seen = tail + data
                after_marker = data
                if link.state == "forward" and self._marker and self._marker in seen:
                    # A pipelined transaction sends its COMMIT in the same bytes, after it.
                    after_marker = seen[seen.index(self._marker) :]
                    link.state, self._marker = "marked", None
                if link.state == "marked" and (
                    b"COMMIT\x00" in after_marker or SYNC in after_marker
                ):
                    link.state = "committing"  # before forwarding: its answer is held
                tail = data[-64:]
            self._flowing.wait()
            try:
                link.server.sendall(data)
            except OSError:
                link.close()
                return

    def _downstream(self, link: _Link) -> None:
        """Server to client: pass everything on, except the answer to the marked COMMIT."""
        while True:
            try:
                data = link.server.recv(65536)
            except OSError:
                data = b""
            if not data:
                link.close()
                return
            with self._lock:
                committing = link.state == "committing"
                if committing:
                    link.held += data
            if committing:
                if READY_FOR_QUERY_IDLE in link.held:  # committed: now lose the answer
                    link.close()
                    with self._lock:
                        self.drops += 1
                    self.dropped.set()
                    return
                continue
            self._flowing.wait()
            try:
                link.client.sendall(data)
            except OSError:
                link.close()
                return


def losing_the_second_claims_reply(proxy: LossyProxy) -> Callable[[str, int], None]:
    """A drain's observer that, once the first job is claimed, has the proxy lose the reply to
    the next claim. The first claim carries the run's registration and reclaim; the next one
    may be pipelined, and at concurrency 1 it carries the first job's completion."""

    def arm_after_the_first_claim(counter: str, n: int) -> None:
        if counter == "claimed" and not proxy.armed() and not proxy.dropped.is_set():
            proxy.drop_commit_reply(CLAIM)

    return arm_after_the_first_claim
