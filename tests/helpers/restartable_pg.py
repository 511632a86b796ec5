"""A PostgreSQL server of a test's own that it may stop, start and restart: the embedded
PostgreSQL binaries of the `pgserver` package, in a data directory of its own, listening on
127.0.0.1 on a free port. Never the machine's shared server, which other tests use.

As root, pgserver runs PostgreSQL as its own `pgserver` user (PostgreSQL refuses to run as
root); this does the same, through pgserver's helpers, so pg_ctl runs as that user too."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

SYSTEM_USER = "pgserver"  # the user pgserver itself runs PostgreSQL as, when started as root
START_TIMEOUT_SECONDS = 60
# How long a connection's backend waits for the client's first message. PostgreSQL's default
# is 60 s, and a shutdown waits for every connection that arrived while it was shutting down
# (each is told "shutting down" once its first message is read): a client that connected
# through a paused proxy (helpers.lossy_proxy) sends none, and held the soak's restart for a
# minute. The proxy's pauses last at most 2 s, so 5 s lets every paused handshake finish.
AUTHENTICATION_TIMEOUT = "5s"


def _pgserver() -> tuple[Any, Any]:
    """pgserver's command wrappers and helpers; ImportError when it is not installed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver import _commands, utils
    return _commands, utils


def available() -> str | None:
    """None when a restartable server can be made here, else the reason it cannot."""
    try:
        _pgserver()
    except ImportError:
        return "pgserver (the embedded PostgreSQL, CPython 3.9-3.12) is not installed"
    if platform.system() == "Windows":
        return "the restartable server is for POSIX systems"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RestartableServer:
    """initdb once, then start/stop/restart at will. Use as a context manager: on exit the
    server is stopped (immediately) and its directory removed."""

    def __init__(
        self, folder: Path | None = None, authentication_timeout: str = AUTHENTICATION_TIMEOUT
    ) -> None:
        self._commands, utils = _pgserver()
        self.authentication_timeout = authentication_timeout
        # A folder directly under /tmp: pytest's own tmp folders are not traversable by the
        # unprivileged user that runs the server.
        self.folder = folder or Path(tempfile.mkdtemp(prefix="pgdrain-pg-"))
        self.pgdata = self.folder / "pgdata"
        self.log = self.folder / "server.log"
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            import pwd

            self.user = SYSTEM_USER
            utils.ensure_user_exists(SYSTEM_USER)
            utils.ensure_prefix_permissions(self.pgdata)
            # What pgserver does before it runs PostgreSQL as that user: let it read and run
            # the binaries and their libraries.
            bin_path = self._commands.POSTGRES_BIN_PATH
            utils.ensure_prefix_permissions(bin_path)
            readable = stat.S_IRGRP | stat.S_IROTH
            utils.ensure_folder_permissions(bin_path, readable | stat.S_IXGRP | stat.S_IXOTH)
            utils.ensure_folder_permissions(bin_path.parent / "lib", readable)
            entry = pwd.getpwnam(SYSTEM_USER)
            for path in (self.folder, self.pgdata):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
        )
        self.starts = 0

    @property
    def bin_path(self) -> Path:
        path: Path = self._commands.POSTGRES_BIN_PATH
        return path

    def url(self, dbname: str = "postgres", user: str = "postgres", password: str = "") -> str:
        auth = f"{user}:{password}@" if password else f"{user}@"
        return f"postgresql://{auth}127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            f"-c authentication_timeout={self.authentication_timeout}"
        )
        self._run(
            "pg_ctl",
            ["-w", "-t", str(START_TIMEOUT_SECONDS), "-o", options, "-l", str(self.log), "start"],
        )
        self.starts += 1

    def stop(self, mode: str = "fast", timeout: int = START_TIMEOUT_SECONDS) -> None:
        """fast: end every session, then shut down cleanly. immediate: like a crash."""
        self._run("pg_ctl", ["-w", "-t", str(timeout), "-m", mode, "stop"])

    def begin_smart_shutdown(self) -> None:
        """Ask for a smart shutdown and return at once: open sessions go on, new connections
        are told the database is shutting down, the server stops when the last session ends."""
        self._run("pg_ctl", ["-W", "-m", "smart", "stop"])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        result = subprocess.run(
            [str(self.bin_path / "pg_ctl"), "-D", str(self.pgdata), "status"],
            capture_output=True,
            user=self.user,
            check=False,
        )
        return result.returncode == 0

    def close(self) -> None:
        if self.pgdata.exists() and self.is_running():
            try:
                self.stop("immediate")
            except RuntimeError:
                if self.is_running():  # else a shutdown under way ended while we asked
                    raise
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RestartableServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, program: str, args: list[str]) -> None:
        command = getattr(self._commands, program)
        try:
            command(args, pgdata=self.pgdata, user=self.user, timeout=START_TIMEOUT_SECONDS + 30)
        except subprocess.CalledProcessError as exc:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{program} {' '.join(args)} failed: {exc}\n{log}") from exc
