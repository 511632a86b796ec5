"""The embedded PostgreSQL (the `pgserver` package) used when DATABASE_URL is unset, so that a
fresh machine needs no database server for `make demo` or `make test`."""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path

from pgdrain.errors import ConfigError, PgdrainError

DATA_DIR_VARIABLE = "PGDRAIN_DATA_DIR"


def default_data_dir() -> Path:
    """Where the CLI keeps its embedded database between commands."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pgdrain" / "pgdata"


def data_dir_in_use() -> Path:
    return Path(os.environ.get(DATA_DIR_VARIABLE) or default_data_dir())


def start(data_dir: Path | None = None, *, keep_running: bool = True) -> str:
    """Start (or reuse) the embedded server and return a connection URI for its `postgres`
    database. keep_running leaves it up after this process exits, for the next CLI command."""
    try:
        with warnings.catch_warnings():
            # pgserver asks platformdirs for XDG_RUNTIME_DIR, which containers rarely set.
            warnings.simplefilter("ignore")
            from pgserver.postgres_server import get_server
    except ImportError:
        raise ConfigError(
            "DATABASE_URL is not set and the embedded PostgreSQL (pgserver, CPython 3.9-3.12) "
            "is not installed: set DATABASE_URL or `pip install pgserver` (pgdrain's [embedded] "
            "extra)"
        ) from None
    folder = data_dir or data_dir_in_use()
    _check_data_dir(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = get_server(folder, cleanup_mode=None if keep_running else "stop")
    return str(server.get_uri())


def _check_data_dir(folder: Path) -> None:
    """The data directory is a folder, made if missing, that is empty or holds PostgreSQL's
    data (PG_VERSION): else one line naming PGDRAIN_DATA_DIR, not initdb's traceback."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{DATA_DIR_VARIABLE} {folder} is a file: set it to a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{DATA_DIR_VARIABLE} {folder} cannot be made a folder ({exc.strerror}): "
            "set it to a folder that can"
        ) from None
    if not (folder / "PG_VERSION").is_file() and any(folder.iterdir()):
        raise ConfigError(
            f"{DATA_DIR_VARIABLE} {folder} holds other files, not PostgreSQL's data: "
            "set it to an empty or new folder"
        )


def running_url(data_dir: Path | None = None) -> str | None:
    """The URL of the embedded server running on `data_dir` (what to give psql, or another
    tool as DATABASE_URL), or None when none runs there. Starts nothing."""
    folder = data_dir or data_dir_in_use()
    if not (folder / "postmaster.pid").is_file():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as in start(): XDG_RUNTIME_DIR
            from pgserver.utils import PostmasterInfo
    except ImportError:
        return None  # not installed: nothing of it can run
    info = PostmasterInfo.read_from_pgdata(folder)
    if info is None or not info.is_running():
        return None
    return str(info.get_uri())


# pgserver runs PostgreSQL as this system user when started by root (PostgreSQL refuses root).
PGSERVER_ROOT_USER = "pgserver"
STOP_TIMEOUT_SECONDS = 60


def stop(data_dir: Path | None = None) -> bool:
    """Stop the embedded server that the CLI left running (`pgdrain server stop`): pg_ctl's
    fast shutdown, which ends open sessions and waits until the server is down. Returns False
    when it was not running. Safe to run twice: the second finds no server."""
    folder = data_dir or data_dir_in_use()
    if not (folder / "postmaster.pid").is_file():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as in start(): XDG_RUNTIME_DIR
            from pgserver._commands import POSTGRES_BIN_PATH
    except ImportError:
        raise ConfigError(
            "the embedded PostgreSQL (pgserver) is not installed, so there is none to stop"
        ) from None
    user = PGSERVER_ROOT_USER if hasattr(os, "geteuid") and os.geteuid() == 0 else None
    done = subprocess.run(
        [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(folder), "-w", "-m", "fast", "stop"],
        user=user,
        capture_output=True,
        text=True,
        timeout=STOP_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        if not (folder / "postmaster.pid").is_file():  # it stopped in the meantime
            return False
        message = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise PgdrainError(
            f"pg_ctl could not stop the server in {folder}: "
            + (message[-1] if message else f"exit {done.returncode}")
        )
    return True
