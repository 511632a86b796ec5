"""How a run stops: at the reserve of its budget, or early, at a request: SIGTERM (a deploy,
`docker stop`, a container scaled in) or SIGINT (Ctrl-C) during `pgdrain drain` or
`pgdrain invoke`.

Either way the run stops claiming and gives back what it claimed and did not start. At the
reserve, running jobs may go on until the final margin before the deadline. At a request, they
get a short grace, then those still running are queued again at once with their attempt given
back (a job whose recovery is manual, or reclaimed as often as its attempts, has its lease ended
instead: runner/heartbeat.py) and the run returns. request() may be called from a signal
handler, which runs in the main thread between any two bytecodes: it takes no lock (a lock the
main thread holds there would be waited for ever), only sets a flag and calls wakers that put an
item on a SimpleQueue (reentrant) or write to a pipe."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from pgdrain.runner.deadline import Deadline
from pgdrain.runner.summary import StopReason

log = logging.getLogger(__name__)

# How long running jobs may go on after a stop request before their leases are ended.
STOP_GRACE_SECONDS = 5.0


class StopRequest:
    def __init__(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        self.grace_seconds = grace_seconds
        self.signum: int | None = None
        self._requested = False  # a flag, not a threading.Event: setting one takes a lock
        self._wakers: list[Callable[[], None]] = []

    def request(self, signum: int | None = None) -> None:
        if self.signum is None:
            self.signum = signum
        self._requested = True
        for wake in list(self._wakers):
            wake()

    def requested(self) -> bool:
        return self._requested

    def on_request(self, wake: Callable[[], None]) -> None:
        """Call `wake` when a stop is requested (at once if it already was)."""
        self._wakers.append(wake)
        if self.requested():
            wake()

    def forget(self, wake: Callable[[], None]) -> None:
        """No longer call `wake`. A request() already under way on another thread may still
        call it once: it iterates over a copy."""
        self._wakers = [w for w in self._wakers if w != wake]

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a stop request"


class Stopping:
    """One run's view of its end, asked by the drain loop on every pass: may it still claim,
    why does it end once nothing runs, and must it end now with jobs still running (the grace
    of a stop request is over, or the deadline's final margin is reached)."""

    def __init__(self, request: StopRequest, deadline: Deadline, worker_id: str) -> None:
        self.request = request
        self._deadline = deadline
        self._worker_id = worker_id
        self._claiming = True
        self._grace_ends_at: float | None = None  # set when the loop first sees the request

    def check_budget_at_start(self) -> None:
        if self._deadline.below_reserve():
            # Say why nothing is claimed: a timeout set too close to the reserve, or a connect
            # that used the budget up, would otherwise look like an empty queue.
            log.warning(
                "budget of %.1f s left is below the reserve of %.1f s: nothing will be claimed",
                self._deadline.remaining(),
                self._deadline.reserve_seconds,
                extra=self._where(),
            )
            self._claiming = False

    def may_claim(self, running: int) -> bool:
        """False from the first pass that sees a stop request or the reserve reached (said once,
        in one line)."""
        if self.request.requested() and self._grace_ends_at is None:
            self._grace_ends_at = time.monotonic() + self.request.grace_seconds
            self._claiming = False
            log.warning(
                "%s: no more claims; running jobs get %.0f s to finish",
                self.request.signal_name,
                self.request.grace_seconds,
                extra={"running": running, **self._where()},
            )
        if self._claiming and self._deadline.below_reserve():
            self._claiming = False
            log.info("budget below reserve: no more claims", extra=self._where())
        return self._claiming

    def reason_when_idle(self) -> StopReason | None:
        """Why a run with nothing running ends; None when it may claim again."""
        if self._grace_ends_at is not None:
            return "stopped"
        if not self._claiming or self._deadline.below_reserve():
            return "budget"
        return None

    def grace_over(self) -> bool:
        return self._grace_ends_at is not None and time.monotonic() >= self._grace_ends_at

    def at_final_margin(self) -> bool:
        return not self._claiming and self._deadline.at_final_margin()

    def next_check_at(self, now: float) -> float:
        """The latest time the loop may wait until before it must look again."""
        check_at = now + self._deadline.seconds_until_check(not self._claiming)
        if self._grace_ends_at is not None:
            check_at = min(check_at, self._grace_ends_at)
        return check_at

    def _where(self) -> dict[str, Any]:
        return {"worker": self._worker_id, "remaining_s": round(self._deadline.remaining(), 2)}


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
