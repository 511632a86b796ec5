"""pgdrain.stop: a stop request, its wake-ups, and the signals routed to it."""

from __future__ import annotations

import os
import signal

from pgdrain import stop


def test_a_request_wakes_every_waiter_once_registered_even_after_the_fact() -> None:
    request = stop.StopRequest(grace_seconds=1.0)
    woken: list[str] = []
    request.on_request(lambda: woken.append("before"))
    assert not request.requested() and stop.exit_code(request) is None
    request.request(signal.SIGTERM)
    request.on_request(lambda: woken.append("after"))
    assert request.requested() and woken == ["before", "after"]
    assert (request.signal_name, stop.exit_code(request)) == ("SIGTERM", 143)


def test_signals_inside_the_context_request_a_stop_and_the_handlers_come_back_after() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert stop.current() is None
    with stop.stop_on_signals() as request:
        assert stop.current() is request
        os.kill(os.getpid(), signal.SIGINT)  # handled in this (the main) thread, at once
        assert request.requested() and stop.exit_code(request) == 130
        # A second signal is not swallowed: the default action is back.
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert stop.current() is None
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
