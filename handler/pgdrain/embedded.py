"""The embedded PostgreSQL (the `pgserver` package) used when DATABASE_URL is unset, so that a
fresh machine needs no database server for `make demo` or `make test`."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from pgdrain.errors import ConfigError

DATA_DIR_VARIABLE = "PGDRAIN_DATA_DIR"


def default_data_dir() -> Path:
    """Where the CLI keeps its embedded database between commands."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pgdrain" / "pgdata"


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
            "is not installed: set DATABASE_URL or `pip install pgdrain[embedded]`"
        ) from None
    folder = data_dir or Path(os.environ.get(DATA_DIR_VARIABLE) or default_data_dir())
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = get_server(folder, cleanup_mode=None if keep_running else "stop")
    return str(server.get_uri())
