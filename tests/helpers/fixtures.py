"""Helpers shared by the test layers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgdrain.sql import query


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds.
    Waits for a state, never for "a bit"."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def without_line(statement: str, fragment: str) -> str:
    """A test-only copy of a real statement with the line holding `fragment` removed: the
    control that shows what that line (a fence, a lock) prevents."""
    lines = statement.splitlines()
    kept = [line for line in lines if fragment not in line]
    assert len(kept) == len(lines) - 1, f"{fragment!r} must stand on exactly one line"
    return "\n".join(kept)


def unfenced(name: str) -> str:
    """The named statement without its attempt_token fence."""
    return without_line(query(name), "attempt_token = ")


def job_row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute("SELECT * FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return row
