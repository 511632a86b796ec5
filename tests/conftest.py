"""Shared fixtures: a real PostgreSQL (DATABASE_URL, else an embedded one), a migrated template
database, and a fresh database cloned from it for every test that asks."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgdrain.migrate import migrate

pytest_plugins = ["helpers.fixtures"]


def _with_dbname(url: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server the tests use: DATABASE_URL if set, else an embedded PostgreSQL of its own."""
    configured = os.environ.get("DATABASE_URL")
    if configured:
        yield configured
        return
    import warnings

    import pgserver

    folder = Path(tmp_path_factory.mktemp("pgdata"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(folder, cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


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


@pytest.fixture(scope="module")
def module_db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by the tests of one module: for tests that only read, or
    that undo what they write (a rolled-back transaction), where a fresh copy each would cost
    a CREATE DATABASE per test."""
    with scratch_database(admin_url, "pgdrain_m", template_db) as url:
        yield url
