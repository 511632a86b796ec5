"""What a failed attempt becomes. A job chooses its outcome by returning (done) or raising:
any exception is a retry with backoff (failed once attempts are spent); pgdrain's outcome
exceptions say more precisely what to do, as River's JobSnooze/JobCancel do. A claimed job of
a kind no function is registered for goes through the same mechanism (decide_unregistered):
retried, because a deploy may not have reached every function that drains the queue yet.

`decide` is pure (no database, no clock): completer.record_failure writes what it returns in one
fenced statement (store.job_fail)."""

from __future__ import annotations

import logging
import math
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from pgdrain.api import retry

log = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 2000  # last_error and each record's message
MAX_TRACEBACK_LENGTH = 8000  # per record; the end of a traceback is kept (where it was raised)
# The longest delay written (a century, as enqueue allows): beyond, PostgreSQL's interval
# arithmetic overflows and the statement recording the failure would fail.
MAX_DELAY_SECONDS = 100 * 365 * 86400.0


class JobOutcome(Exception):
    """Base of the exceptions a job raises to choose its outcome."""


def _seconds(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} needs a finite number of seconds")
    # An int is finite (math.isfinite raises OverflowError past a float's range: 10**400).
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} needs a finite number of seconds")
    if not 0 <= value <= MAX_DELAY_SECONDS:
        raise ValueError(f"{what} needs 0 to {MAX_DELAY_SECONDS:g} seconds")
    return float(value)


class RetryIn(JobOutcome):
    """Retry after exactly `seconds` (an attempt is spent; failed once attempts are spent)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        self.seconds = _seconds(seconds, "RetryIn")
        self.reason = reason
        super().__init__(reason or f"retry in {self.seconds:g} s")


class Snooze(JobOutcome):
    """Run again after `seconds` without spending an attempt (waiting on something external).
    No error is recorded: nothing is added to the error history, and `last_error` keeps the
    latest real error. Logged at INFO (`job snoozed`); the run's summary counts it as retried."""

    def __init__(self, seconds: float) -> None:
        self.seconds = _seconds(seconds, "Snooze")
        super().__init__(f"snoozed for {self.seconds:g} s")


class Discard(JobOutcome):
    """Fail now, whatever attempts are left: the job can never succeed as it is."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Cancel(JobOutcome):
    """Stop the job for good: it ends at once as `cancelled` (the state `pgdrain cancel`
    leaves; `pgdrain retry ID` queues it again), whatever attempts are left, its last error
    `cancelled: reason`. Logged as `job cancelled`; the run's summary counts it as cancelled."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Decision(NamedTuple):
    """What to write for a failed attempt."""

    message: str  # last_error: one line, sanitized, bounded
    delay_seconds: float  # until the next attempt (ignored when final)
    final: bool  # failed now, whatever attempts are left
    spend_attempt: bool  # False for a snooze: the attempt is given back
    record: bool  # appended to the job's error history
    error_type: str
    traceback: str  # sanitized and bounded; "" when there is none worth keeping
    cancelled: bool = False  # final as `cancelled` (the job chose it), not `failed`


def decide(error: BaseException, attempt: int, backoff: Callable[[int], float]) -> Decision:
    """The outcome of an attempt that raised `error`. `backoff(attempt)` gives the delay of an
    ordinary retry."""
    error_type = safe_text(type(error).__name__, 200)
    if isinstance(error, Snooze | RetryIn):
        # Checked again here: a subclass may set `seconds` itself (from a Retry-After header,
        # say), and any code may change it after the constructor checked it. A delay nothing
        # can store would make the statement recording it fail, and the run with it.
        what = "Snooze" if isinstance(error, Snooze) else "RetryIn"
        try:
            seconds = _seconds(error.seconds, what)
        except Exception as exc:  # a subclass's `seconds` may be a property raising anything
            message = bounded(
                f"{error_text(error)} ({safe_str(exc)}: retried with backoff)", MAX_ERROR_LENGTH
            )
            return Decision(message, delay(backoff, attempt), False, True, True, error_type, "")
        snoozed = isinstance(error, Snooze)
        return Decision(error_text(error), seconds, False, not snoozed, not snoozed, error_type, "")
    if isinstance(error, Discard):
        message = bounded(f"discarded: {safe_str(error)}", MAX_ERROR_LENGTH)
        return Decision(message, 0.0, True, True, True, error_type, "")
    if isinstance(error, Cancel):
        message = bounded(f"cancelled: {safe_str(error)}", MAX_ERROR_LENGTH)
        return Decision(message, 0.0, True, True, True, error_type, "", cancelled=True)
    return Decision(
        error_text(error),
        delay(backoff, attempt),
        False,
        True,
        True,
        error_type,
        traceback_text(error),
    )


def decide_unregistered(error: BaseException, attempt: int) -> Decision:
    """The outcome of a claimed job whose kind no function is registered for here (the run's
    lookup raised `error`). River's choice: retried with the default backoff, not failed,
    because a deploy may not have reached every function that drains the queue yet. Only the
    lookup: an UnknownJobKind a job's own code raises is an ordinary failure (decide)."""
    message = bounded(
        f"{error_text(error)} in this deployment (a deploy may not have reached every "
        "function yet, or the queue is another deployment's: see PGDRAIN_QUEUES)",
        MAX_ERROR_LENGTH,
    )
    error_type = safe_text(type(error).__name__, 200)
    return Decision(
        message, delay(retry.backoff_seconds, attempt), False, True, True, error_type, ""
    )


def delay(backoff: Callable[[int], float], attempt: int) -> float:
    """A kind's backoff for `attempt`, or the default backoff when the kind's function raises
    or gives no storable number of seconds (a bad delay must not stop the run)."""
    try:
        seconds = backoff(attempt)
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not 0 <= seconds <= MAX_DELAY_SECONDS
        ):
            raise ValueError(f"backoff returned {seconds!r}")
        return float(seconds)
    except Exception as exc:  # user code: fall back, and say so
        log.warning(
            "a kind's backoff failed; the default backoff is used",
            extra={"attempt": attempt, "error": error_text(exc)},
        )
        return retry.backoff_seconds(attempt)


def sanitize(text: str) -> str:
    """Storable in PostgreSQL text and jsonb: NUL written as \\x00 (neither can hold it), lone
    surrogates as \\udXXX (they are not UTF-8; psycopg would raise UnicodeEncodeError)."""
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def safe_text(text: str, limit: int) -> str:
    return bounded(sanitize(text), limit)


def bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def safe_str(error: BaseException) -> str:
    """str(error), or a note when its __str__ raises (hostile or broken job code must not stop
    the run that records it)."""
    try:
        text = str(error)
    except Exception as exc:  # any exception from user code: fall back to the type
        return f"<str() raised {type(exc).__name__}>"
    if not isinstance(text, str):  # a __str__ returning a non-str already raised TypeError
        return "<str() returned no text>"
    return safe_text(text, MAX_ERROR_LENGTH)


def error_text(error: BaseException) -> str:
    """`Type: message`, one record's worth: sanitized and bounded."""
    text = safe_str(error)
    name = type(error).__name__
    return safe_text(f"{name}: {text}" if text else name, MAX_ERROR_LENGTH)


def traceback_text(error: BaseException) -> str:
    """The formatted traceback, sanitized, its end kept within MAX_TRACEBACK_LENGTH; without
    pgdrain's own frames (the run that called the job), which say nothing about the job."""
    try:
        summary = traceback.TracebackException.from_exception(error)
        _without_pgdrain_frames(summary)
        text = "".join(summary.format())
    except Exception as exc:  # formatting runs user code (__str__, __notes__): never fatal
        return f"<traceback could not be formatted: {type(exc).__name__}>"
    text = sanitize(text)
    if len(text) > MAX_TRACEBACK_LENGTH:
        text = "…" + text[-(MAX_TRACEBACK_LENGTH - 1) :]
    return text


# pgdrain's own files, as imported and as resolved (a frame names the file as it was imported).
_PGDRAIN_FOLDERS = tuple(
    {
        str(folder) + os.sep
        for folder in (Path(__file__).parents[1], Path(__file__).resolve().parents[1])
    }
)


def _without_pgdrain_frames(summary: traceback.TracebackException) -> None:
    """Drop the frames of pgdrain's own files from a traceback and those it was raised from
    (all of them kept when nothing else is left: an error of pgdrain's own)."""
    seen: set[int] = set()
    pending: list[traceback.TracebackException | None] = [summary]
    while pending:
        part = pending.pop()
        if part is None or id(part) in seen:
            continue
        seen.add(id(part))
        theirs = [f for f in part.stack if not f.filename.startswith(_PGDRAIN_FOLDERS)]
        if theirs:
            part.stack = traceback.StackSummary.from_list(theirs)
        pending += [part.__cause__, part.__context__, *(part.exceptions or [])]


class AttemptFailed(Exception):
    """Raised by the worker thread in place of a job's exception (which is its __cause__), with
    the outcome already decided there: the kind's backoff is known there, and formatting a
    traceback stays off the one thread that talks to the database."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        super().__init__(decision.message)
