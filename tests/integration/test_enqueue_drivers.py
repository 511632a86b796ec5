"""Transactional enqueue with any driver: pgdrain.enqueue_statement's (sql, params) run inside
the application's own transaction on psycopg 3 (sync and async), psycopg2, asyncpg, a
SQLAlchemy session and Django's connection. In each: the job is invisible while the
transaction is open, visible after its commit (with the application's own row), gone after its
rollback; kick() runs after the commit. These are the examples of docs/jobs.md."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import pgdrain
from helpers.aws import FUNCTION_NAME
from pgdrain import BadInput, Settings, enqueue_statement
from pgdrain.aws.kick import kick

Conn = psycopg.Connection[Any]
# Called while the application's transaction is open, after the enqueue ran in it.
During = Callable[[], None]
ORDER = "INSERT INTO public.orders (item) VALUES ('book')"


def _parts(url: str) -> dict[str, Any]:
    """host, port, user, password, dbname of a conninfo (a URL or key=value)."""
    parts = psycopg.conninfo.conninfo_to_dict(url)
    return {k: parts.get(k) for k in ("host", "port", "user", "password", "dbname")}


def _psycopg_sync(url: str, commit: bool, during: During) -> int | None:
    sql, params = enqueue_statement("ship", {"item": "book"})
    with psycopg.connect(url) as app:
        app.execute(ORDER)
        row = app.execute(sql, params).fetchone()
        during()
        app.commit() if commit else app.rollback()
    return None if row is None else int(row[0])


def _psycopg_async(url: str, commit: bool, during: During) -> int | None:
    sql, params = enqueue_statement("ship", {"item": "book"})

    async def main() -> int | None:
        async with await psycopg.AsyncConnection.connect(url) as app:
            await app.execute(ORDER)
            cursor = await app.execute(sql, params)
            row = await cursor.fetchone()
            during()
            await (app.commit() if commit else app.rollback())
        return None if row is None else int(row[0])

    return asyncio.run(main())


def _psycopg2(url: str, commit: bool, during: During) -> int | None:
    psycopg2 = pytest.importorskip("psycopg2")
    sql, params = enqueue_statement("ship", {"item": "book"})
    app = psycopg2.connect(url)
    try:
        with app.cursor() as cursor:
            cursor.execute(ORDER)
            cursor.execute(sql, params)
            row = cursor.fetchone()
        during()
        app.commit() if commit else app.rollback()
    finally:
        app.close()
    return None if row is None else int(row[0])


def _asyncpg(url: str, commit: bool, during: During) -> int | None:
    asyncpg = pytest.importorskip("asyncpg")
    sql, params = enqueue_statement("ship", {"item": "book"}, paramstyle="dollar")

    async def main() -> int | None:
        p = _parts(url)
        app = await asyncpg.connect(
            host=p["host"],
            port=p["port"],
            user=p["user"],
            password=p["password"],
            database=p["dbname"],
        )
        try:
            transaction = app.transaction()
            await transaction.start()
            await app.execute(ORDER)
            job_id = await app.fetchval(sql, *params)
            during()
            await (transaction.commit() if commit else transaction.rollback())
        finally:
            await app.close()
        return None if job_id is None else int(job_id)

    return asyncio.run(main())


def _sqlalchemy(url: str, commit: bool, during: During) -> int | None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    sql, params = enqueue_statement("ship", {"item": "book"}, paramstyle="named")
    engine = _engine(url)
    try:
        with Session(engine) as session:
            session.execute(sqlalchemy.text(ORDER))
            job_id = session.execute(sqlalchemy.text(sql), params).scalar()
            during()
            session.commit() if commit else session.rollback()
    finally:
        engine.dispose()
    return None if job_id is None else int(job_id)


def _engine(url: str) -> Any:
    """A SQLAlchemy engine on psycopg 3."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    p = _parts(url)
    return sqlalchemy.create_engine(
        sqlalchemy.engine.URL.create(
            "postgresql+psycopg",
            username=p["user"],
            password=p["password"],
            host=p["host"],
            port=None if p["port"] is None else int(p["port"]),
            database=p["dbname"],
        )
    )


def _django(url: str, commit: bool, during: During) -> int | None:
    pytest.importorskip("django")
    import django
    from django.conf import settings
    from django.db import connections, transaction

    p = _parts(url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": p["dbname"],
        "USER": p["user"] or "",
        "PASSWORD": p["password"] or "",
        "HOST": p["host"] or "",
        "PORT": p["port"] or "",
    }
    if not settings.configured:
        settings.configure(DATABASES={"default": database}, USE_TZ=True)
        django.setup()
    connections["default"].close()
    connections["default"].settings_dict.update(database)  # this test's own database

    sql, params = enqueue_statement("ship", {"item": "book"})

    class Rollback(Exception):
        pass

    row = None
    try:
        with transaction.atomic():
            with connections["default"].cursor() as cursor:
                cursor.execute(ORDER)
                cursor.execute(sql, params)
                row = cursor.fetchone()
            during()
            if not commit:
                raise Rollback
    except Rollback:
        pass
    finally:
        connections["default"].close()
    return None if row is None else int(row[0])


DRIVERS = {
    "psycopg3": _psycopg_sync,
    "psycopg3-async": _psycopg_async,
    "psycopg2": _psycopg2,
    "asyncpg": _asyncpg,
    "sqlalchemy": _sqlalchemy,
    "django": _django,
}


@pytest.fixture
def orders(conn: Conn) -> None:
    conn.execute("CREATE TABLE public.orders (id serial PRIMARY KEY, item text NOT NULL)")


def _counts(conn: Conn) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgdrain.jobs), (SELECT count(*) FROM public.orders)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.parametrize("driver", sorted(DRIVERS))
@pytest.mark.usefixtures("orders")
def test_the_job_is_visible_only_after_the_applications_commit_then_kicked(
    db_url: str, conn: Conn, driver: str, lambda_api: Any
) -> None:
    seen: list[tuple[int, int]] = []
    job_id = DRIVERS[driver](db_url, True, lambda: seen.append(_counts(conn)))
    assert seen == [(0, 0)]  # neither the order nor its job, while the transaction is open
    assert _counts(conn) == (1, 1)
    row = conn.execute(
        "SELECT kind, payload, status FROM pgdrain.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == ("ship", {"item": "book"}, "queued")
    settings = Settings(function_name=FUNCTION_NAME)
    assert kick(conn, ["default"], settings=settings, client=lambda_api) == ("default",)


@pytest.mark.parametrize("driver", sorted(DRIVERS))
@pytest.mark.usefixtures("orders")
def test_the_job_is_gone_after_the_applications_rollback(
    db_url: str, conn: Conn, driver: str
) -> None:
    DRIVERS[driver](db_url, False, lambda: None)
    assert _counts(conn) == (0, 0)


@pytest.mark.parametrize("paramstyle", ["pyformat", "named", "dollar"])
def test_a_repeated_idempotency_key_returns_no_row(conn: Conn, paramstyle: str) -> None:
    sql, params = enqueue_statement("ship", idempotency_key="order-1")
    assert conn.execute(sql, params).fetchone() is not None
    assert conn.execute(sql, params).fetchone() is None
    named, _ = enqueue_statement("ship", paramstyle=paramstyle)  # type: ignore[arg-type]
    assert "%(" not in named or paramstyle == "pyformat"


def test_enqueue_statement_validates_as_enqueue_does() -> None:
    from pgdrain import BadInput

    with pytest.raises(BadInput, match="payload"):
        enqueue_statement("ship", {"blob": "x" * 300_000})
    with pytest.raises(BadInput, match="paramstyle"):
        enqueue_statement("ship", paramstyle="qmark")  # type: ignore[arg-type]


# -- pgdrain's own functions take a synchronous psycopg 3 Connection, and say so ------------

CALLS: dict[str, Callable[[Any], object]] = {
    "enqueue": lambda c: pgdrain.enqueue(c, "ship"),
    "enqueue_many": lambda c: pgdrain.enqueue_many(c, [pgdrain.build_job("ship")]),
    "workflow": lambda c: pgdrain.workflow(c).__enter__(),
    "job_state": lambda c: pgdrain.job_state(c, 1),
    "pause_queue": lambda c: pgdrain.pause_queue(c, "emails"),
    "resume_queue": lambda c: pgdrain.resume_queue(c, "emails"),
    "kick": lambda c: kick(c, ["emails"], settings=Settings(function_name=FUNCTION_NAME)),
}


@contextlib.contextmanager
def _other_connection(url: str, driver: str) -> Iterator[object]:
    if driver == "psycopg-async":
        async_conn = asyncio.run(psycopg.AsyncConnection.connect(url))
        try:
            yield async_conn
        finally:
            asyncio.run(async_conn.close())
    elif driver == "psycopg2":
        psycopg2 = pytest.importorskip("psycopg2")
        with contextlib.closing(psycopg2.connect(url)) as legacy:
            yield legacy
    elif driver == "sqlalchemy":
        engine = _engine(url)
        try:
            with engine.connect() as connection:
                yield connection
        finally:
            engine.dispose()
    else:
        yield None


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("driver", ["psycopg-async", "psycopg2", "sqlalchemy", "none"])
def test_another_drivers_connection_is_refused_naming_what_to_use(
    db_url: str, conn: Conn, call: str, driver: str
) -> None:
    """A red team's report: AttributeError or TypeError from deep inside, or a coroutine
    never awaited."""
    with _other_connection(db_url, driver) as other:
        with pytest.raises(BadInput, match=f"^{call}: needs a synchronous psycopg 3 Connection"):
            CALLS[call](other)
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)
