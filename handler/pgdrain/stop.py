"""A request to end a run early: SIGTERM (a deploy, `docker stop`, a container scaled in) or
SIGINT (Ctrl-C) during `pgdrain drain` or `pgdrain invoke`.

The run stops claiming, gives back what it claimed and did not start, lets running jobs finish
for a short grace, then ends the leases of those still running at once (reclaimable now, not
a lease later) and returns. request() may be called from a signal handler: it only sets an
event and calls wakers that put an item on a SimpleQueue (reentrant)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

# How long running jobs may go on after a stop request before their leases are ended.
STOP_GRACE_SECONDS = 5.0


class StopRequest:
    def __init__(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        self.grace_seconds = grace_seconds
        self.signum: int | None = None
        self._event = threading.Event()
        self._wakers: list[Callable[[], None]] = []

    def request(self, signum: int | None = None) -> None:
        if self.signum is None:
            self.signum = signum
        self._event.set()
        for wake in list(self._wakers):
            wake()

    def requested(self) -> bool:
        return self._event.is_set()

    def on_request(self, wake: Callable[[], None]) -> None:
        """Call `wake` when a stop is requested (at once if it already was)."""
        self._wakers.append(wake)
        if self.requested():
            wake()

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a stop request"


# The stop request signals are routed to while stop_on_signals() is active: a run started
# without one of its own (the Lambda handler under `pgdrain invoke`) obeys it.
_current: StopRequest | None = None


def current() -> StopRequest | None:
    return _current


@contextmanager
def stop_on_signals(stop: StopRequest | None = None) -> Iterator[StopRequest]:
    """While inside, SIGINT and SIGTERM request a stop instead of killing the process (a second
    one kills it as usual). Only from the main thread, where Python runs signal handlers."""
    global _current
    stop = stop or StopRequest()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.request(signum)
        for sig in signals:  # a second signal is not ignored: the default action applies
            signal.signal(sig, signal.SIG_DFL)

    for sig in signals:
        signal.signal(sig, handle)
    outer, _current = _current, stop
    try:
        yield stop
    finally:
        _current = outer
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_code(stop: StopRequest) -> int | None:
    """128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as shells report it; None
    when no signal stopped the run."""
    return None if stop.signum is None else 128 + stop.signum
