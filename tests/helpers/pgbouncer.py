"""PgBouncer (Debian's `pgbouncer` package) started by the tests on a free port in front of a
PostgreSQL server, in transaction pooling mode: what Neon's -pooler endpoint and most managed
poolers put between a function and its database.

It forwards every database name to the same server (`* = host=… port=…`), so each test's own
database is reachable through it. PgBouncer refuses to run as root: as root it runs as the
owner of the server's socket directory (a unix-socket server, such as the embedded one), or as
`nobody` (a TCP server)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

from helpers.restartable_pg import free_port

START_TIMEOUT_SECONDS = 30.0


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    for candidate in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def version(executable: str) -> tuple[int, ...]:
    """(1, 18, 0) from `PgBouncer 1.18.0`."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True)
    words = out.stdout.split()
    return tuple(int(part) for part in words[words.index("PgBouncer") + 1].split("."))


class PgBouncer:
    def __init__(
        self,
        server_url: str,
        *,
        users: tuple[str, ...] = ("postgres",),
        pool_mode: str = "transaction",
        pool_size: int = 2,
    ) -> None:
        executable = find_pgbouncer()
        if executable is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.executable = executable
        params = psycopg.conninfo.conninfo_to_dict(server_url)
        self.server_params = params
        host = str(params.get("host") or "/var/run/postgresql")
        port = str(params.get("port") or "5432")
        self.port = free_port()
        self.run_as = self._run_as(host)
        self.folder = Path(tempfile.mkdtemp(prefix="pgdrain-pgbouncer-"))
        self.log = self.folder / "pgbouncer.log"
        userlist = "".join(f'"{user}" ""\n' for user in users)
        # From 1.21 PgBouncer can track protocol-level prepared statements itself (on by default
        # from 1.24); off here, so that what the tests show does not depend on the version
        # installed (pgdrain prepares nothing, and needs no pooler to track anything).
        prepared = "max_prepared_statements = 0\n" if version(executable) >= (1, 21) else ""
        (self.folder / "userlist.txt").write_text(userlist)
        (self.folder / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "\n[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.folder / 'userlist.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            "server_reset_query =\n"
            f"{prepared}"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.folder / 'pgbouncer.pid'}\n"
        )
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _run_as(host: str) -> str | None:
        if os.geteuid() != 0:
            return None
        if host.startswith("/"):
            return pwd.getpwuid(os.stat(host).st_uid).pw_name
        return "nobody"

    def url(self, server_url: str) -> str:
        """server_url (a database on the upstream server) as reached through the pooler."""
        params = psycopg.conninfo.conninfo_to_dict(server_url)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.executable, str(self.folder / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.run_as,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start:\n{self.log_text()}")
            time.sleep(0.02)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
