"""Job kinds: a Registry maps a kind to the function that runs it, and the Job handed to it."""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import importlib
import inspect
import json
import math
import sys
import traceback
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pgdrain.api import jsonbound, retry
from pgdrain.api import periodic as periodic_mod
from pgdrain.api.enqueue import KIND_TEXT, is_kind_text
from pgdrain.api.outcomes import safe_str
from pgdrain.api.retry import RetryPolicy
from pgdrain.db import store
from pgdrain.errors import BadInput, ConfigError, JobsModuleNotFound, UnknownJobKind

if TYPE_CHECKING:
    from pgdrain.api.enqueue import ParamStyle

JobFunction = Callable[["Job"], object]
MAX_KINDS_NAMED = 10  # an unknown kind's message lists at most this many of the known ones


@dataclass(frozen=True, slots=True)
class Job:
    """What a job function receives. Frozen: the function reads it, the runner owns it."""

    id: int
    kind: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    attempt_token: uuid.UUID
    _remaining: Callable[[], float] = field(repr=False, compare=False)
    _lost_tokens: Collection[uuid.UUID] = field(repr=False, compare=False)
    # Progress recorded and not yet written, per attempt (the run's Attempts.progress).
    _progress: MutableMapping[store.Held, str] | None = field(
        default=None, repr=False, compare=False
    )
    # Whether the run's leases may have run out unrenewed (Attempts.lease_lapsed).
    _lease_lapsed: Callable[[], bool] = field(default=lambda: False, repr=False, compare=False)

    def remaining(self) -> float:
        """Seconds left of the run's budget, or of the kind's timeout if that ends first."""
        return self._remaining()

    def lease_lost(self) -> bool:
        """True once a heartbeat found this attempt's lease gone: another attempt may own the
        job now, and nothing this one returns will be recorded. Long jobs should stop. True
        also while the lease may have run out unrenewed (the heartbeat's reply has not come
        within a lease: a pooler's queue, a stalled server): another run may take the job."""
        return self.attempt_token in self._lost_tokens or self._lease_lapsed()

    def record_progress(self, value: Any) -> None:
        """Record how far the job is: a number or a small JSON value (at most
        MAX_PROGRESS_BYTES), shown by `pgdrain jobs show`. The latest value is written with
        the run's next heartbeat, or as the attempt ends, fenced by the attempt's token (a
        stale attempt writes nothing): the job's thread never waits for the database."""
        text = bounded_json(value, "progress", MAX_PROGRESS_BYTES)
        if self._progress is not None:
            self._progress[store.Held(self.id, self.attempt_token)] = text

    def dependency_outputs(self, conn: store.Connection) -> dict[int, Any]:
        """{job id: output} of the jobs this one waited for (enqueued with `after=`), read on
        `conn`, a connection of the job's own: only the run's loop uses the run's."""
        return store.job_dependency_outputs(conn, self.id)


# A job's recorded values: the output (its function's return value) is bounded as payloads
# are; progress is meant to be small.
MAX_OUTPUT_BYTES = 256 * 1024
MAX_PROGRESS_BYTES = 4 * 1024


def bounded_json(value: Any, what: str, limit: int) -> str:
    """`value` as JSON text to store, or BadInput: too deep, not JSON, or over `limit` bytes."""
    jsonbound.check_value_depth(value, what)
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadInput(f"{what} text is not valid UTF-8 (it holds a lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        raise BadInput(f"{what} is not JSON-serialisable: {exc}") from None
    if size > limit:
        raise BadInput(f"{what} is {size} bytes; the limit is {limit}")
    if jsonbound.holds_nul(text):
        raise BadInput(f"{what} contains a NUL character, which PostgreSQL jsonb cannot store")
    return text


# A middleware is called with each Job and returns a context manager that wraps the job's
# function: tracing, error reporting, the user's own logging. It sees the job's exception.
Middleware = Callable[["Job"], AbstractContextManager[object]]
# A kind's retry delay: a RetryPolicy, or any function of the attempt number (1-based).
Backoff = RetryPolicy | Callable[[int], float]


class KindOptions(NamedTuple):
    """Per-kind options from the decorator; None means "not said": enqueue's own default."""

    queue: str | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: float | None = None  # seconds: the job's own deadline inside the run's budget
    priority: int | None = None
    recovery_policy: str | None = None


class Registered(NamedTuple):
    function: JobFunction
    is_async: bool  # an `async def`: run on the worker thread's event loop
    options: KindOptions


class Registry:
    def __init__(self) -> None:
        self._kinds: dict[str, Registered] = {}
        self._middleware: list[Middleware] = []
        self._periodic: list[periodic_mod.Periodic] = []

    def job(
        self,
        kind: str,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        recovery_policy: str | None = None,
    ) -> Callable[[JobFunction], JobFunction]:
        """Decorator: register `fn` as the function for `kind`. The options are the kind's
        defaults: `Registry.enqueue` uses them when the caller does not say; `backoff` and
        `timeout` apply when the job runs. Bad options raise ValueError at import."""
        if not kind or not kind.strip():
            raise ValueError("a job kind must not be empty")
        if not is_kind_text(kind):  # else every enqueue of it (a periodic slot's too) is refused
            raise ValueError(f"job kind {kind!r:.60} must be {KIND_TEXT}")
        options = KindOptions(queue, max_attempts, backoff, timeout, priority, recovery_policy)
        _check_options(kind, options)

        def register(fn: JobFunction) -> JobFunction:
            if kind in self._kinds:
                raise ValueError(f"job kind {kind!r} is registered twice")
            self._kinds[kind] = Registered(fn, inspect.iscoroutinefunction(fn), options)
            return fn

        return register

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: dt.timedelta | None = None,
        kind: str | None = None,
        payload: Any = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        recovery_policy: str | None = None,
    ) -> Callable[[JobFunction], JobFunction]:
        """Decorator: register `fn` as kind `kind` (default: its name), with the options of
        `job()`, and enqueue it with `payload` at each slot of `cron` (5 fields, UTC) or
        `every` (a rate; slots at multiples of it since 1970-01-01 UTC). Each slot is enqueued
        once, by whatever run starts after it falls due (periodic.enqueue_due)."""
        schedule: periodic_mod.Schedule
        if cron is not None and every is None:
            schedule = periodic_mod.Cron(cron)
        elif every is not None and cron is None:
            schedule = periodic_mod.Every(every)
        else:
            raise ValueError("periodic: give a cron expression or every=, one of the two")

        def register(fn: JobFunction) -> JobFunction:
            name = kind or fn.__name__
            self.job(
                name,
                queue=queue,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout=timeout,
                priority=priority,
                recovery_policy=recovery_policy,
            )(fn)
            entry = periodic_mod.Periodic(
                name,
                schedule,
                payload,
                **self.defaults(name),  # the kind's queue, priority, max_attempts, policy
            )
            try:
                entry.job_for()  # a payload enqueue would refuse
            except BadInput as exc:
                raise ValueError(f"periodic job kind {name!r}: {exc}") from None
            self._periodic.append(entry)
            return fn

        return register

    @property
    def periodics(self) -> tuple[periodic_mod.Periodic, ...]:
        return tuple(self._periodic)

    def middleware(self, fn: Middleware) -> Middleware:
        """Register `fn(job) -> context manager` to wrap every job's function (usable as a
        decorator). The first registered is the outermost."""
        self._middleware.append(fn)
        return fn

    @property
    def middlewares(self) -> list[Middleware]:
        """The registered middleware, outermost first (the registry's own list: read it)."""
        return self._middleware

    def registered(self, kind: str) -> Registered:
        try:
            return self._kinds[kind]
        except KeyError:
            raise UnknownJobKind(f"no function is registered for job kind {kind!r}") from None

    def check_kind(self, kind: str, where: str = "") -> None:
        """UnknownJobKind, naming the nearest registered kind, unless `kind` is registered
        (`where`: what the message says after the kind, such as the module)."""
        if not isinstance(kind, str):  # as pgdrain.enqueue says it
            raise BadInput("job kind must be a non-empty string")
        if kind in self._kinds:
            return
        message = f"no function is registered for job kind {kind[:80]!r}{where}"
        nearest = difflib.get_close_matches(kind, self._kinds, n=1)
        if nearest:
            message += f" (did you mean {nearest[0]!r}?)"
        elif self._kinds:
            shown = sorted(self._kinds)[:MAX_KINDS_NAMED]
            more = ", ..." if len(self._kinds) > MAX_KINDS_NAMED else ""
            message += f"; the kinds are {', '.join(shown)}{more}"
        raise UnknownJobKind(message)

    def options(self, kind: str) -> KindOptions:
        """The kind's options; all unset for a kind this registry does not know."""
        found = self._kinds.get(kind)
        return found.options if found else KindOptions()

    def backoff_for(self, kind: str) -> Callable[[int], float]:
        """The delay before the next attempt after attempt N fails, for this kind."""
        backoff = self.options(kind).backoff
        if backoff is None:
            return retry.backoff_seconds
        if isinstance(backoff, RetryPolicy):
            return functools.partial(retry.backoff_seconds, policy=backoff)
        return backoff

    def enqueue(
        self,
        conn: store.Connection,
        kind: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        run_at: dt.datetime | None = None,
        delay: float = 0.0,
        priority: int | None = None,
        max_attempts: int | None = None,
        recovery_policy: str | None = None,
        idempotency_key: str | None = None,
        sequence: str | None = None,
        after: Iterable[int] | None = None,
    ) -> int:
        """pgdrain.enqueue with this kind's decorator options as the defaults (an argument
        given here wins). A kind this registry does not know raises UnknownJobKind (a typo
        would otherwise be retried and failed by every run): pgdrain.enqueue takes any kind."""
        from pgdrain.api.enqueue import enqueue  # enqueue does not know registries

        self.check_kind(kind)
        return enqueue(
            conn,
            kind,
            payload,
            run_at=run_at,
            delay=delay,
            idempotency_key=idempotency_key,
            sequence=sequence,
            after=after,
            **self.defaults(
                kind,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                recovery_policy=recovery_policy,
            ),
        )

    def enqueue_statement(
        self,
        kind: str,
        payload: Any = None,
        *,
        paramstyle: ParamStyle = "pyformat",
        queue: str | None = None,
        run_at: dt.datetime | None = None,
        delay: float = 0.0,
        priority: int | None = None,
        max_attempts: int | None = None,
        recovery_policy: str | None = None,
        idempotency_key: str | None = None,
        sequence: str | None = None,
        after: Iterable[int] | None = None,
    ) -> tuple[str, dict[str, Any] | list[Any]]:
        """pgdrain.enqueue_statement (the insert as (sql, params) for any driver) with this
        kind's decorator options as the defaults (an argument given here wins). A kind this
        registry does not know raises UnknownJobKind, as Registry.enqueue does."""
        from pgdrain.api.enqueue import enqueue_statement

        self.check_kind(kind)
        return enqueue_statement(
            kind,
            payload,
            paramstyle=paramstyle,
            run_at=run_at,
            delay=delay,
            idempotency_key=idempotency_key,
            sequence=sequence,
            after=after,
            **self.defaults(
                kind,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                recovery_policy=recovery_policy,
            ),
        )

    def defaults(self, kind: str, **given: Any) -> dict[str, Any]:
        """The enqueue fields the caller gave (not None), else the kind's options, else
        nothing (enqueue's own defaults)."""
        options = self.options(kind)
        fields = {
            "queue": options.queue,
            "priority": options.priority,
            "max_attempts": options.max_attempts,
            "recovery_policy": options.recovery_policy,
        }
        merged = {
            name: given.get(name) if given.get(name) is not None else value
            for name, value in fields.items()
        }
        return {name: value for name, value in merged.items() if value is not None}

    def kinds(self) -> list[str]:
        return sorted(self._kinds)

    def __contains__(self, kind: object) -> bool:
        return kind in self._kinds


def _check_options(kind: str, options: KindOptions) -> None:
    from pgdrain.api.enqueue import build_job  # the same checks enqueue applies

    try:  # an option given is checked as given: "" is no queue, not the default one
        build_job(
            kind,
            queue_name="default" if options.queue is None else options.queue,
            priority=0 if options.priority is None else options.priority,
            max_attempts=5 if options.max_attempts is None else options.max_attempts,
            recovery_policy="auto" if options.recovery_policy is None else options.recovery_policy,
        )
    except BadInput as exc:
        raise ValueError(f"job kind {kind!r}: {exc}") from None
    timeout = options.timeout
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ValueError(f"job kind {kind!r}: timeout must be a positive number of seconds")
    if options.backoff is not None and not (
        isinstance(options.backoff, RetryPolicy) or callable(options.backoff)
    ):
        raise ValueError(f"job kind {kind!r}: backoff must be a RetryPolicy or a function")


@contextmanager
def on_sys_path(folder: Path) -> Iterator[None]:
    """`folder` first on sys.path while a jobs module is imported from it (the function's code
    directory, as Lambda puts it there), and gone again after unless it was there before."""
    entry = str(folder)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


def load_registry(module_name: str) -> Registry:
    """Import the module named by PGDRAIN_JOBS and return the Registry it defines (the first
    module attribute that is one; by convention `jobs`).

    Where it is looked for: the Python path. The `pgdrain` command puts the current directory
    first on it (cli.main; a console script would not), so a jobs module beside where you run
    `pgdrain drain` is found, as `python -m` would find it; in Lambda the code root (handler/,
    the working directory) is on the path."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise JobsModuleNotFound(
                f"PGDRAIN_JOBS: module {module_name!r} was not found on the Python path "
                "(which holds the current directory when run by the pgdrain command)"
            ) from None
        raise ConfigError(_import_failure(module_name, exc)) from None
    except (Exception, SystemExit) as exc:  # the user's module: anything its top level raises
        # (sys.exit() included: a module that exits at import failed to import), in one line
        raise ConfigError(_import_failure(module_name, exc)) from None
    preferred = getattr(module, "jobs", None)
    candidates = [preferred] if isinstance(preferred, Registry) else []
    candidates += [v for v in vars(module).values() if isinstance(v, Registry)]
    if not candidates:
        raise ConfigError(f"PGDRAIN_JOBS: module {module_name!r} defines no pgdrain.Registry")
    if not candidates[0].kinds():
        # A drain would claim every job and fail it: refused before anything is claimed.
        raise ConfigError(
            f"PGDRAIN_JOBS: module {module_name!r} registers no job kinds "
            '(decorate a function with @jobs.job("kind"))'
        )
    return candidates[0]


def _import_failure(module_name: str, exc: BaseException) -> str:
    """One line: the module, the error, and where it was raised (the innermost frame, or the
    file and line of a syntax error). The error's text is the module's code (its __str__ may
    raise): read through outcomes.safe_str."""
    lines = [line.strip() for line in safe_str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}, line {exc.lineno}"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else ""
    return f"PGDRAIN_JOBS: module {module_name!r} failed to import: {text}" + (
        f" ({where})" if where else ""
    )
