"""Whether a backend is waiting on a heavyweight lock (a row, a table, an advisory lock), as
the server reports it: how a race test knows the other side has reached the lock it holds,
without sleeping. Each takes the observer's own connection, outside the transactions it
watches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from helpers.fixtures import wait_for

Conn = psycopg.Connection[Any]


def waits_on_a_lock(observer: Conn, pid: int) -> bool:
    """The backend `pid` waits on a lock."""
    row = observer.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_catalog.pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


def named_waits_on_a_lock(observer: Conn, application_name: str) -> bool:
    """A backend of this application_name waits on a lock (for a backend the test cannot ask
    its pid of, such as a drain's)."""
    row = observer.execute(
        "SELECT count(*) FROM pg_catalog.pg_stat_activity"
        " WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()
    return bool(row and row[0])


def someone_here_waits_on_a_lock(observer: Conn) -> bool:
    """A backend of the observer's database waits on a lock."""
    row = observer.execute(
        "SELECT count(*) FROM pg_catalog.pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return bool(row and row[0])


def on_a_connection_of_its_own(
    db_url: str, name: str, call: Callable[[Conn], object], pids: dict[str, int]
) -> threading.Thread:
    """`call` on a new autocommit connection, in a thread started now; the connection's
    backend pid is put in `pids` under `name` first (for waits_on_a_lock), and it gives up on
    a lock after 5 s rather than hang the test."""

    def body() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            pids[name] = conn.info.backend_pid
            conn.execute("SET lock_timeout = '5s'")
            call(conn)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def a_raise_holds_up_the_next_write(
    observer: Conn,
    holder: Conn,
    db_url: str,
    first_write: Callable[[Conn], object],
    raise_statement: str,
    next_write: Callable[[Conn], object],
) -> bool:
    """A floor's raise (migrations 0024, 0026) against its writers: `first_write` in a
    transaction of `holder` left open, then `raise_statement` and `next_write`, each on a
    connection of its own. Whether `next_write` was held up while the first stayed open (a
    raise that waits for the lock, rather than trying it, queues the next writer behind it)."""
    pids: dict[str, int] = {}
    with holder.transaction():
        first_write(holder)
        raiser = on_a_connection_of_its_own(
            db_url, "raise", lambda conn: conn.execute(raise_statement.encode()), pids
        )
        wait_for(
            lambda: not raiser.is_alive() or waits_on_a_lock(observer, pids.get("raise", 0)),
            what="the raise returned or waits",
        )
        writer = on_a_connection_of_its_own(db_url, "write", next_write, pids)
        wait_for(
            lambda: not writer.is_alive() or waits_on_a_lock(observer, pids.get("write", 0)),
            what="the next write returned or waits",
        )
        held_up = writer.is_alive()
    raiser.join(20)
    writer.join(20)
    return held_up
