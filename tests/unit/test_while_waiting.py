"""db.DrainConnection's work done while a statement is out, on psycopg's own generator protocol
(what psycopg.generators yields: Wait.W or Wait.RW while the statement is flushed, then Wait.R
for the reply), driven here as psycopg's wait drives it, without a server."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from psycopg.waiting import Ready, Wait

from pgdrain.db.connection import _calling_when_sent, _Once


def _statement(log: list[str], waits: list[Wait]) -> Generator[Wait, Any, str]:
    """A statement as psycopg runs one: each wait it yields is logged when it is answered."""
    for wait in waits:
        ready = yield wait
        log.append(f"answered {wait.name} with {Ready(ready).name}")
    return "reply"


def _drive(gen: Generator[Wait, Any, str]) -> str:
    """As psycopg.waiting.wait does: each wait answered as ready for what it waited for."""
    try:
        wait = next(gen)
        while True:
            wait = gen.send(Ready(int(wait)))
    except StopIteration as done:
        return str(done.value)


def test_the_work_runs_once_at_the_first_wait_to_read_after_the_statement_is_flushed() -> None:
    log: list[str] = []
    once = _Once(lambda: log.append("work"))
    gen = _calling_when_sent(_statement(log, [Wait.RW, Wait.RW, Wait.R, Wait.R]), once)

    assert _drive(gen) == "reply"
    assert log == [
        "answered RW with RW",
        "answered RW with RW",
        "work",
        "answered R with R",
        "answered R with R",
    ]
    once.call()  # what DrainConnection.wait does after: nothing left to do
    assert log.count("work") == 1


def test_a_statement_that_never_waits_to_read_leaves_the_work_to_after_it() -> None:
    log: list[str] = []
    once = _Once(lambda: log.append("work"))

    assert _drive(_calling_when_sent(_statement(log, [Wait.RW]), once)) == "reply"
    assert log == ["answered RW with RW"]
    once.call()
    assert log == ["answered RW with RW", "work"]


def test_an_error_in_the_work_waits_until_the_reply_is_read() -> None:
    log: list[str] = []

    def fails() -> None:
        raise RuntimeError("can't start new thread")

    once = _Once(fails)

    assert _drive(_calling_when_sent(_statement(log, [Wait.R, Wait.R]), once)) == "reply"
    assert log == ["answered R with R", "answered R with R"]  # the statement read to its end
    with pytest.raises(RuntimeError, match="can't start new thread"):
        once.raise_its_error()
    once.raise_its_error()  # raised once
