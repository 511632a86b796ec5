"""Test-only copies of a migration's plpgsql function, under a name of their own, with one part
changed: the controls that show what that part (a lock, a read, a bound) prevents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from helpers.fixtures import without_line

Conn = psycopg.Connection[Any]


def function_text(conn: Conn, function: str) -> str:
    """The definition of `function` ('pgdrain.f()') as the database holds it."""
    row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (function,)).fetchone()
    assert row is not None
    return str(row[0])


def function_copy(conn: Conn, function: str, name: str, change: Callable[[str], str]) -> None:
    """Create `name`, a copy of `function` ('pgdrain.f()') with its text passed through
    `change`."""
    text = change(function_text(conn, function))
    original = function.removesuffix("()")
    assert original in text
    conn.execute(text.replace(original, name, 1).encode())


def function_without(conn: Conn, function: str, fragment: str, name: str) -> None:
    """A copy with the line holding `fragment` removed."""
    function_copy(conn, function, name, lambda text: without_line(text, fragment))


def function_replacing(conn: Conn, function: str, old: str, new: str, name: str) -> None:
    """A copy with `old` replaced by `new` (`old` must be there)."""

    def replace(text: str) -> str:
        assert old in text, f"{old!r} is not in {function}"
        return text.replace(old, new)

    function_copy(conn, function, name, replace)


def raise_without_its_try(conn: Conn, function: str) -> Callable[[Conn], None]:
    """A floor's raise (migrations 0024, 0026) with its try of the lock taken out: the control
    that shows a raise past a writer in flight, whose rows it cannot see."""
    function_without(conn, function, "pg_try_advisory_xact_lock", "pgdrain.raise_unlocked")

    def raise_unlocked(c: Conn) -> None:
        c.execute("SELECT pgdrain.raise_unlocked()")

    return raise_unlocked
