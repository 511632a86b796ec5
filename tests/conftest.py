"""Shared fixtures: a real PostgreSQL (DATABASE_URL, else an embedded one), a migrated template
database, and a fresh database cloned from it for every test that asks.

The embedded server belongs to this run alone: its data directory, its log and its Unix
socket live in a fresh directory of its own directly under /tmp (pgserver listens on no TCP
port), so runs at the same time on one machine do not meet. Not under pytest's basetemp: as
root, pgserver runs PostgreSQL as the user `pgserver`, which must traverse the path, and every
pytest session that starts on the machine resets /tmp/pytest-of-<user> to mode 0700 (pytest's
own safety measure): another run starting made initdb fail, or the server unreachable.

If it cannot start, or dies during the run (killed by something else on the machine), the run
stops with one message and the tail of the server's own log, instead of a connection error in
every test that follows."""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers.lossy_proxy import LossyProxy
from pgdrain.db.migrate import migrate

pytest_plugins = ["helpers.fixtures", "helpers.aws_fixtures", "helpers.wheel"]


def _with_dbname(url: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


LOG_TAIL_LINES = 30
# Set to 1 to switch the watch off (tests/acceptance/test_embedded_server.py's control).
NO_WATCH_VARIABLE = "PGDRAIN_TEST_NO_SERVER_WATCH"


class EmbeddedServer:
    """This run's embedded PostgreSQL: where its data and log are, and whether it still runs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log = folder / "log"  # where pgserver tells pg_ctl to write it
        self.server: Any = None
        self.died_reported = False
        self.errors = _Remember()  # pgserver logs a failed initdb's or pg_ctl's stderr

    def failure_text(self) -> str:
        """What pgserver said about a failed start, then the tail of the server's log."""
        said = "\n".join(self.errors.lines[-LOG_TAIL_LINES:])
        return (said + "\n" if said else "") + (
            f"--- the last lines of its log ({self.log}) ---\n{self.log_tail()}"
        )

    def start(self) -> str:
        import warnings

        with warnings.catch_warnings():
            # pgserver asks platformdirs for XDG_RUNTIME_DIR, which containers rarely set.
            warnings.simplefilter("ignore")
            import pgserver

            pgserver_log = logging.getLogger("pgserver")
            pgserver_log.addHandler(self.errors)
            try:
                self.server = pgserver.get_server(self.folder, cleanup_mode="delete")
            finally:
                pgserver_log.removeHandler(self.errors)
        uri = str(self.server.get_uri())
        # The socket must be in this run's folder: a shared fallback directory (pgserver uses
        # one when the path is too long for a socket) would be shared state between runs.
        socket_dir = self.server.get_postmaster_info().socket_dir
        assert socket_dir is not None and Path(socket_dir) == self.folder.resolve(), socket_dir
        return uri

    def alive(self) -> bool:
        if self.server is None:
            return False
        info = self.server.get_postmaster_info()
        return bool(info.is_running())

    def log_tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no server log at {self.log}: {exc.strerror})"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def stop(self) -> None:
        if self.server is not None:
            self.server.cleanup()


class _Remember(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(record.getMessage().splitlines())


_embedded: EmbeddedServer | None = None


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """The server the tests use: DATABASE_URL if set, else an embedded PostgreSQL of its own."""
    global _embedded
    configured = os.environ.get("DATABASE_URL")
    if configured:
        yield configured
        return
    # Fresh and private (mkdtemp), short (a Unix socket path is limited to about 107 bytes).
    embedded = EmbeddedServer(Path(tempfile.mkdtemp(prefix="pgdrain-test-pg-")))
    try:
        uri = embedded.start()
    except Exception as exc:
        pytest.exit(
            f"the embedded PostgreSQL could not start in {embedded.folder} (kept for a look): "
            f"{type(exc).__name__}: {exc}\n{embedded.failure_text()}",
            returncode=3,
        )
    _embedded = embedded
    try:
        yield uri
    finally:
        _embedded = None
        embedded.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """After a test fails, look at the embedded server once: if it is gone, stop the run with
    one message and the tail of its log (the failures that would follow say nothing new)."""
    outcome = yield
    report = outcome.get_result()
    embedded = _embedded
    if (
        report.failed
        and embedded is not None
        and not embedded.died_reported
        and os.environ.get(NO_WATCH_VARIABLE) != "1"
        and not embedded.alive()
    ):
        embedded.died_reported = True
        item.session.shouldstop = (
            f"the embedded PostgreSQL of this run died (during or before {item.nodeid}); "
            f"the tests after it would only fail to connect.\n{embedded.failure_text()}"
        )


@pytest.fixture(scope="session")
def admin_url(server_url: str) -> str:
    return _with_dbname(server_url, "postgres")


@contextmanager
def scratch_database(admin_url: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """Create a database (a copy of `template`, if given), yield its URL, drop it after."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(create)
    try:
        yield _with_dbname(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    """A migrated database that each test's database is copied from."""
    with scratch_database(admin_url, "pgdrain_tpl") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


@pytest.fixture
def db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test alone."""
    with scratch_database(admin_url, "pgdrain_t", template_db) as url:
        yield url


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """A fresh database without the pgdrain schema (for migration tests)."""
    with scratch_database(admin_url, "pgdrain_e") as url:
        yield url


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, observing from outside the runner."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def other(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A second autocommit connection to the test's database: another run, or the
    application."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="module")
def module_db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by the tests of one module: for tests that only read, or
    that undo what they write (a rolled-back transaction), where a fresh copy each would cost
    a CREATE DATABASE per test."""
    with scratch_database(admin_url, "pgdrain_m", template_db) as url:
        yield url


@pytest.fixture
def proxy(db_url: str) -> Iterator[LossyProxy]:
    """A loopback proxy in front of the test's database that can lose a reply on purpose."""
    lossy = LossyProxy(db_url)
    yield lossy
    lossy.close()
