"""pgdrain.runner.stop: a stop request, its wake-ups, the signals routed to it, and when a run stops
claiming and waiting (the reserve, the final margin, a stop request's grace)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pgdrain.budget import FINAL_MARGIN_SECONDS, Budget
from pgdrain.runner import stop
from pgdrain.runner.deadline import Deadline


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


class _Left:
    """A budget's remaining seconds, set by the test."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self) -> float:
        return self.seconds


def test_at_the_reserve_the_run_stops_claiming_and_waits_until_the_final_margin() -> None:
    left = _Left(10.0)
    stopping = stop.Stopping(stop.StopRequest(), Deadline(Budget(left), 2.0), "w")
    stopping.check_budget_at_start()
    assert stopping.may_claim(running=0) and stopping.reason_when_idle() is None
    left.seconds = 1.5
    assert not stopping.may_claim(running=1) and stopping.reason_when_idle() == "budget"
    assert not stopping.at_final_margin() and not stopping.grace_over()
    left.seconds = FINAL_MARGIN_SECONDS
    assert stopping.at_final_margin()


def test_a_stop_request_ends_claims_and_the_grace_bounds_the_wait() -> None:
    request = stop.StopRequest(grace_seconds=60.0)
    stopping = stop.Stopping(request, Deadline(Budget(_Left(600.0)), 2.0), "w")
    assert stopping.may_claim(running=0)
    request.request(signal.SIGTERM)
    assert not stopping.may_claim(running=2) and stopping.reason_when_idle() == "stopped"
    assert not stopping.grace_over()
    now = time.monotonic()
    assert stopping.next_check_at(now) <= now + 60.0  # not the deadline, 10 minutes away
    over = stop.Stopping(
        stop.StopRequest(grace_seconds=0.0), Deadline(Budget(_Left(600.0)), 2.0), "w"
    )
    over.request.request()
    assert not over.may_claim(running=1) and over.grace_over()


def test_a_budget_below_the_reserve_at_the_start_claims_nothing() -> None:
    stopping = stop.Stopping(stop.StopRequest(), Deadline(Budget(_Left(1.0)), 2.0), "w")
    stopping.check_budget_at_start()
    assert not stopping.may_claim(running=0) and stopping.reason_when_idle() == "budget"


# A run at concurrency 1 (loop_thread.py): the calling thread waits on its slot's wake-up, which
# a stop request gives from the signal's handler. The handler runs in that same thread, at any
# bytecode, so here the signal is raised at the second line the thread runs inside the wait:
# past the start of threading.Event's `with self._cond:`, as a SIGTERM can land.
_SIGNAL_INSIDE_THE_WAIT = """
import os, signal, sys, threading
from pgdrain.runner import stop
from pgdrain.runner.loop_thread import OneSlot, Wake


class EventWake(threading.Event):
    def wait_and_clear(self, seconds):
        self.wait(seconds)
        self.clear()


slot = OneSlot(lambda job: None)
if sys.argv[1] == "event":
    slot.watch_wake = EventWake()
inside = {Wake.wait_and_clear.__code__, threading.Event.wait.__code__}
lines = 0


def trace(frame, event, arg):
    if event == "call" and frame.f_code in inside:
        return trace_lines
    return None


def trace_lines(frame, event, arg):
    global lines
    if event == "line" and frame.f_code in inside:
        lines += 1
        if lines == 2:
            os.kill(os.getpid(), signal.SIGINT)
    return trace_lines


with stop.stop_on_signals() as request:
    request.on_request(slot.wake)
    sys.settrace(trace)
    slot.watch_wake.wait_and_clear(0.0)
    sys.settrace(None)
    print("stop requested" if request.requested() else "no stop")
"""


@pytest.mark.parametrize(
    ("wake", "exits"), [("wake", True), ("event", False)], ids=["wake", "control-event"]
)
def test_a_signal_inside_the_watching_threads_wait_wakes_it_only_with_a_reentrant_wake(
    wake: str, exits: bool
) -> None:
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-c", textwrap.dedent(_SIGNAL_INSIDE_THE_WAIT), wake]
    env = {"PYTHONPATH": str(root / "handler"), "PATH": "/usr/bin:/bin"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=10, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        assert not exits, "the handler waited for the lock its own thread held"
        return
    assert exits, done.stdout + done.stderr
    assert (done.returncode, done.stdout.strip()) == (0, "stop requested"), done.stderr
