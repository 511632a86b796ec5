"""`pgdrain worker`: a long-running process that drains as the Lambda function does, for a
local development loop, or in a container when a job outgrows Lambda's 15 minutes.

It drains when kicked: LISTEN pgdrain_kick, which pgdrain.kick() sends when no function
drains (api/kick_target.py), or any client with `NOTIFY pgdrain_kick`. It drains on its own
at the next due moment: the earliest delayed job or retry, the lease expiry of a job another
run holds, read by the statement a Lambda run ends with (store.run_exit); the next slot of a
periodic kind; and, as the function's rate schedule does, the safety net's interval
(PGDRAIN_SCHEDULE_RATE, else an hour). In between it waits on its listening connection and
sends nothing: an idle worker costs the database no statement.

Each wake is one drain (runner/drain.py) on a connection the drain opens and closes; the
listening connection runs nothing but its LISTEN (psycopg: do not LISTEN on a connection that
runs queries). Kicks that arrive while it drains wait on that connection, and the worker drains
again as soon as that drain ends: none is lost between a drain's last claim and the wait. A
drain has no deadline (a worker is not killed at a timeout): leases are a lease long, renewed
by the heartbeat, and job.remaining() is NO_DEADLINE_SECONDS.

After a drain, at most once per safety-net interval (the first drain included), it keeps the
history as the function's scheduled runs do (db/retention.py): finished jobs past
PGDRAIN_RETAIN_DONE / PGDRAIN_RETAIN_FAILED deleted, the day partitions of done jobs made ahead
and dropped past their age. Otherwise a worker that runs for weeks, with nobody running
`pgdrain purge` and `pgdrain migrate` from cron, keeps every finished job, and once its day
partitions run out, done jobs go to the default partition, deleted by rows.

A stop (SIGINT, SIGTERM: runner/stop.py) ends the wait at once, or makes the drain stop
claiming, give running jobs the grace, release what has not started and give back the jobs still
running (queued again at once, the attempt not counted: runner/heartbeat.py). A listening
connection that breaks is opened again, with backoff while the database is down, and the worker
drains then: a kick sent meanwhile is lost, its job is not."""

from __future__ import annotations

import datetime as dt
import logging
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg

from pgdrain.api import periodic
from pgdrain.api.kick_target import LISTENER_APPLICATION_NAME, kicked_queues
from pgdrain.api.registry import Registry
from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import connection, retention, store
from pgdrain.db.session import Session
from pgdrain.errors import ConfigError, DatabaseUnavailable
from pgdrain.runner.drain import default_worker_id, drain_with, drained_periodics
from pgdrain.runner.limits import send_configured_limits
from pgdrain.runner.stop import StopRequest
from pgdrain.runner.summary import COUNTERS, Counter, DrainResult
from pgdrain.settings import QUEUE_NAME, Settings, describe_queues

log = logging.getLogger(__name__)

# How many queues a worker says it was kicked for and does not serve, in all (a NOTIFY is any
# client's: without a bound, names made up by the thousand would fill its log and memory).
MAX_UNSERVED_SAID = 20

# A worker's drain has no deadline: what Budget.remaining() says until a stop. Statements are
# limited to it (a day: no real limit, as without pgdrain) and leases never reach it. After a
# stop, what is left is the grace and the reserve: a connect that cannot succeed gives up then.
NO_DEADLINE_SECONDS = 86_400.0
# The function's rate schedule (template.yaml's ScheduleRate default): the worker's safety net
# when PGDRAIN_SCHEDULE_RATE is unset. A job enqueued without a kick runs within this.
DEFAULT_SAFETY_NET_SECONDS = 3600.0
# The shortest wait for a due moment: a worker whose clock runs ahead of the database's wakes
# a little early, finds the job not yet due, and must not spin until the clocks agree.
MIN_WAIT_SECONDS = 0.5
# While the database is down or a drain fails: waits from the first to the last, doubling.
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0

# Why the worker drained: its start, a kick, a due moment (a delayed job, a retry, a lease),
# a periodic slot, the safety net, its listening connection opened again, or a retry after
# a drain that failed.
WakeReason = Literal["start", "kick", "due", "periodic", "safety net", "reconnect", "retry"]
Waited = Literal["kick", "timeout", "stop", "lost"]
_SAID = {"due": "work due", "periodic": "a periodic slot", "safety net": "the safety net"}


@dataclass
class WorkerSummary:
    """What a worker did, from its start to its stop."""

    drains: int = 0
    woken: dict[str, int] = field(default_factory=dict)  # drains by WakeReason
    totals: dict[Counter, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    errors: int = 0  # drains that ended in an error (retried)

    def add(self, result: DrainResult, reason: WakeReason) -> None:
        self.drains += 1
        self.woken[reason] = self.woken.get(reason, 0) + 1
        for name in COUNTERS:
            self.totals[name] += getattr(result, name)
        self.errors += result.stop_reason == "error"

    def as_dict(self) -> dict[str, Any]:
        counts = {str(name): n for name, n in self.totals.items()}
        return {"drains": self.drains, "woken": dict(self.woken), **counts}


class Worker:
    """Drain on every kick and at every due moment, until `stop` is requested. `controls` is
    for tests only (listen_for_kicks=False: the control that shows what LISTEN does);
    `report` is called after each drain."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        conninfo: str,
        *,
        stop: StopRequest,
        controls: Controls = ALL_ON,
        report: Callable[[DrainResult, WakeReason], None] | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.conninfo = conninfo
        self.stop = stop
        self.controls = controls
        self.worker_id = default_worker_id()
        self.safety_net_s = settings.schedule_rate_seconds or DEFAULT_SAFETY_NET_SECONDS
        self.next_due = NextDue(
            self.worker_id,
            settings,
            periodic.EnqueuedSince(
                drained_periodics(registry, settings.queues, controls),
                catch_up=controls.enqueue_slots_fallen_due,
            ),
        )
        self._report = report or (lambda _result, _reason: None)
        self._retry_s = FIRST_RETRY_SECONDS
        # Each drain gets a stop request of its own (its pool registers a waker on it); the
        # worker's passes a stop on to the drain under way.
        self._drain_stop: StopRequest | None = None
        self._stopped_at: float | None = None
        self._history_kept_at: float | None = None  # time.monotonic() of the last retention
        stop.on_request(self._stop_the_drain)

    def _stop_the_drain(self) -> None:
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        current = self._drain_stop
        if current is not None:
            current.request(self.stop.signum)

    def _remaining(self) -> float:
        """A drain's budget: no deadline, until a stop (NO_DEADLINE_SECONDS)."""
        if self._stopped_at is None:
            return NO_DEADLINE_SECONDS
        ends_at = self._stopped_at + self.stop.grace_seconds + self.settings.reserve_seconds
        return ends_at - time.monotonic()

    def run(self) -> WorkerSummary:
        """Until a stop: drain, wait for a kick or the next due moment, drain again. Settings
        that cannot work (the database refuses the credentials...) raise ConfigError."""
        summary = WorkerSummary()
        reason: WakeReason = "start"
        listener = Listener(
            self.conninfo,
            self.settings,
            self.stop,
            listen=self.controls.listen_for_kicks,
            queues=self.settings.queues,
            signals_wake=self.controls.wake_the_wait_on_a_signal_to_any_thread,
        )
        try:
            while not self.stop.requested():
                if not listener.is_open():
                    if not listener.open():
                        break  # stopped while the database was down
                    reason = "start" if reason == "start" else "reconnect"
                result = self._drain()
                if result.stop_reason in ("empty", "budget") and self._history_due():
                    # Before the drain is reported: what the worker does for it is done then.
                    self._keep_history()
                summary.add(result, reason)
                self._report(result, reason)
                if result.stop_reason == "stopped":
                    break
                woke = self._wait_after(result, listener)
                if woke is None:
                    break
                reason = woke
        finally:
            self._drain_stop = None
            listener.shut()
        return summary

    def _drain(self) -> DrainResult:
        self._drain_stop = stop = StopRequest(self.stop.grace_seconds)
        if self.stop.requested():  # a stop that came before the line above
            stop.request(self.stop.signum)
        return drain_with(
            self.controls,
            self.settings,
            Budget(self._remaining),
            self.registry,
            self.conninfo,
            queues=self.settings.queues,
            worker_id=self.worker_id,
            hooks=self.next_due,
            stop=stop,
        )

    def _history_due(self) -> bool:
        """Retention after the first drain, then at most once per safety-net interval, however
        often kicks wake the worker."""
        last = self._history_kept_at
        return last is None or time.monotonic() - last >= self.safety_net_s

    def _keep_history(self) -> None:
        """Finished jobs past their retention deleted and the day partitions kept, for at most
        retention.MAX_SECONDS, on a connection of its own. Safe to repeat, and beside a function
        or another worker doing the same (db/retention.py). A failure is logged and skipped: the
        next interval tries again."""
        started = time.monotonic()
        self._history_kept_at = started
        budget = Budget(
            lambda: (
                0.0
                if self.stop.requested()
                else retention.MAX_SECONDS - (time.monotonic() - started)
            )
        )
        deleted = retention.run_on_a_connection_of_its_own(self.conninfo, self.settings, budget)
        if deleted is not None:
            retention.log_result(log, self.settings, deleted)

    def _wait_after(self, result: DrainResult, listener: Listener) -> WakeReason | None:
        """Wait for a kick or the next due moment; None when a stop came."""
        due: WakeReason
        if result.stop_reason == "error":
            if result.error_kind in ("configuration", "authentication"):
                raise ConfigError(result.error or "the settings cannot work")
            wait_s, due = self._retry_s, "retry"
            self._retry_s = min(self._retry_s * 2, MAX_RETRY_SECONDS)
            log.warning("drain failed; the worker drains again in %.0f s", wait_s)
        else:
            self._retry_s = FIRST_RETRY_SECONDS
            wait_s, due = self.next_wake(dt.datetime.now(dt.UTC))
        log.info(
            "idle: waiting for a kick, or %s in %.1f s",
            _SAID.get(due, due),
            wait_s,
            extra={"worker": self.worker_id},
        )
        waited = listener.wait(wait_s)
        if waited == "stop":
            return None
        if waited == "lost":
            return "reconnect"
        return "kick" if waited == "kick" else due

    def next_wake(self, now: dt.datetime) -> tuple[float, WakeReason]:
        """Seconds until the next due moment, and what falls due then."""
        moments: list[tuple[float, WakeReason]] = [(self.safety_net_s, "safety net")]
        if self.next_due.due_at is not None:
            moments.append(((self.next_due.due_at - now).total_seconds(), "due"))
        slot = self.next_due.periodics.next_slot()
        if slot is not None:
            moments.append(((slot - now).total_seconds(), "periodic"))
        seconds, reason = min(moments)
        return max(seconds, MIN_WAIT_SECONDS), reason


class NextDue:
    """The drain's hooks: before it exits, the statement a Lambda run ends with
    (store.run_exit) says whether a job became ready after its last claim (drain again) and
    when work is next due in its queues. The worker is no Lambda run: it registers nothing
    and clears no kick window (pgdrain.kicks belongs to the function's kicks). It writes its queue
    limits, as a run does (send_configured_limits)."""

    def __init__(
        self, worker_id: str, settings: Settings, periodics: periodic.EnqueuedSince
    ) -> None:
        self._worker_id = worker_id
        self._settings = settings
        self._queues = settings.queues
        self.due_at: dt.datetime | None = None
        self.periodics = periodics

    def after_connect(self, session: Session) -> bool:
        self.due_at = None
        self.periodics.enqueued()  # the drain enqueues its due slots next (runner/drain.py)
        send_configured_limits(session, self._settings, self._queues)
        return True  # one worker process: no fan-out cap to keep

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        pass

    def before_exit(self, session: Session) -> bool:
        self.periodics.enqueue_fallen_due(session)
        # One statement, only reads and housekeeping: safe to repeat after a reconnect.
        check = session.run(
            store.run_exit, self._worker_id, self._queues, may_stay=False, clear_kicks=False
        )
        # When work is due, on this host's clock: the database says how far ahead (its own
        # clock), not at what moment, which a host clock ahead or behind would read early
        # or late.
        self.due_at = (
            None
            if check.due_in_s is None
            else dt.datetime.now(dt.UTC) + dt.timedelta(seconds=check.due_in_s)
        )
        return check.ready


class Listener:
    """The worker's listening connection: LISTEN pgdrain_kick, then nothing but waiting. A
    stop request wakes the wait through a pipe (request() may run in a signal handler: a
    write to a pipe is all it does)."""

    def __init__(
        self,
        conninfo: str,
        settings: Settings,
        stop: StopRequest,
        *,
        listen: bool,
        queues: tuple[str, ...] | None,  # None: every queue
        signals_wake: bool,
    ) -> None:
        self._conninfo = conninfo
        self._settings = settings
        self._stop = stop
        self._listen = listen
        self._signals_wake = signals_wake
        self._queues = None if queues is None else frozenset(queues)
        self._said_unserved: set[str] = set()  # the kicked queues it said it does not serve
        self._conn: psycopg.Connection[Any] | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # The pipe is closed once nothing refers to this listener, not in shut(): a request() on
        # another thread may have taken _wake before shut() and call it after. Its call holds
        # the listener, so the pipe's numbers cannot have gone to another file by then.
        self._pipe_closer = weakref.finalize(self, _close_pipe, self._wake_r, self._wake_w)
        stop.on_request(self._wake)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # full: a wake is pending anyway
            pass

    def is_open(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def open(self) -> bool:
        """Connect and LISTEN; while the database is not up, try again after a doubling wait.
        False when a stop came first. Settings that cannot work raise (ConfigError)."""
        retry_s = FIRST_RETRY_SECONDS
        while not self._stop.requested():
            try:
                self._conn = self._connect()
                return True
            except (DatabaseUnavailable, psycopg.OperationalError) as exc:
                log.warning(
                    "worker: the database is not reachable; trying again in %.0f s: %s",
                    retry_s,
                    connection.one_line(exc),
                )
            if self._sleep(retry_s):
                return False
            retry_s = min(retry_s * 2, MAX_RETRY_SECONDS)
        return False

    def _connect(self) -> psycopg.Connection[Any]:
        settings = self._settings
        # While the database is not up, connect() tries again (logging each) until a stop.
        per_attempt = settings.connect_timeout + settings.reserve_seconds
        budget = Budget(lambda: 0.0 if self._stop.requested() else per_attempt)
        conn = connection.connect(
            self._conninfo, settings, budget, application_name=LISTENER_APPLICATION_NAME
        )
        try:
            if self._listen:
                store.kick_listen(conn)
        except BaseException:
            conn.close()
            raise
        log.info(
            "worker: listening for kicks",
            extra={"queues": "*" if self._queues is None else sorted(self._queues)},
        )
        return conn

    def wait(self, timeout: float) -> Waited:
        """Until a kick for one of the worker's queues (one that came while it drained
        included), a stop, `timeout` seconds, or the connection breaking."""
        conn = self._conn
        assert conn is not None, "open() the listener first"
        ends_at = time.monotonic() + timeout
        while True:
            if self._stop.requested():
                return "stop"
            try:
                if self._kicked(conn):
                    return "kick"
            except psycopg.OperationalError as exc:
                log.warning("worker: the listening connection broke: %s", connection.one_line(exc))
                self.close()
                return "lost"
            left = ends_at - time.monotonic()
            if left <= 0:
                return "timeout"
            ready = self._select([conn.fileno(), self._wake_r], left)
            if self._wake_r in ready:
                self._drain_pipe()

    def _kicked(self, conn: psycopg.Connection[Any]) -> bool:
        """Read what has arrived, without waiting: was one of this worker's queues kicked?"""
        kicked = False
        for notify in conn.notifies(timeout=0):
            queues = kicked_queues(notify.payload)
            kicked = kicked or queues is None or self._queues is None or bool(queues & self._queues)
            if queues is not None and self._queues is not None:
                self._say_unserved(queues - self._queues)
        if conn.broken:
            raise psycopg.OperationalError("the connection is broken")
        return kicked

    def _say_unserved(self, queues: frozenset[str]) -> None:
        """A kick for queues this worker does not serve wakes it for nothing: said once each,
        as the application's kick() cannot tell which worker serves what. Any client may
        NOTIFY: only names a queue can have reach the log, and at most MAX_UNSERVED_SAID."""
        room = MAX_UNSERVED_SAID - len(self._said_unserved)
        if room <= 0:
            return
        new = sorted(q for q in queues - self._said_unserved if QUEUE_NAME.match(q))[:room]
        if new:
            self._said_unserved.update(new)
            full = len(self._said_unserved) == MAX_UNSERVED_SAID
            log.warning(
                "kicked for %s, which this worker does not serve (%s): their jobs wait for a "
                "worker or a function that does%s",
                ", ".join(new),
                describe_queues(self._settings.queues),
                "; kicks for other queues it does not serve are not said" if full else "",
            )

    def _sleep(self, seconds: float) -> bool:
        """Wait, unless a stop comes first (True then)."""
        if self._select([self._wake_r], seconds):
            self._drain_pipe()
        return self._stop.requested()

    def _select(self, fds: list[int], seconds: float) -> list[int]:
        """Wait until one of `fds` is readable, or `seconds`. A signal interrupts the wait only
        in the thread the system hands it to: Linux picks the main thread, other systems any
        thread that does not block it (a job's thread, a library's). Python runs the handler in
        the main thread, and only once that thread runs again. So, for the wait, the signal also
        writes a byte to the wake pipe (set_wakeup_fd, the main thread's to set), whichever
        thread took it, and the wait ends at once."""
        if not self._signals_wake or threading.current_thread() is not threading.main_thread():
            return select.select(fds, [], [], seconds)[0]
        before = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            return select.select(fds, [], [], seconds)[0]
        finally:
            signal.set_wakeup_fd(before)

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Close the connection (open() opens another)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def shut(self) -> None:
        """Close the connection and stop being woken: the worker returns. (The pipe closes with
        the listener.)"""
        self.close()
        self._stop.forget(self._wake)


def _close_pipe(read_end: int, write_end: int) -> None:
    os.close(read_end)
    os.close(write_end)
