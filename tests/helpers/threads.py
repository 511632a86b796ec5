"""Which threads a test's code starts, by name (threading.Thread.start, spied on)."""

from __future__ import annotations

import threading

import pytest


def started_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on, in the order they started."""
    names: list[str] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        real_start(thread)
        names.append(thread.name)

    monkeypatch.setattr(threading.Thread, "start", start)
    return names
