"""Which threads a test's code starts, by name (threading.Thread.start, spied on), and what
happens just before each start (a test may hold it or make it fail)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest


def on_thread_start(
    monkeypatch: pytest.MonkeyPatch, before: Callable[[threading.Thread, list[str]], None]
) -> list[str]:
    """The names of the threads started from now on, in the order they started. `before` is
    called with each thread about to start and the names so far, in the thread that starts it:
    it may wait (the start waits) or raise (the start fails with that error)."""
    names: list[str] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        before(thread, names)
        real_start(thread)
        names.append(thread.name)

    monkeypatch.setattr(threading.Thread, "start", start)
    return names


def started_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on, in the order they started."""
    return on_thread_start(monkeypatch, lambda thread, names: None)
