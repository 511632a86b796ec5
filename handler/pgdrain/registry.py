"""Job kinds: a Registry maps a kind to the function that runs it, and the Job handed to it."""

from __future__ import annotations

import importlib
import traceback
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pgdrain.errors import ConfigError, UnknownJobKind

JobFunction = Callable[["Job"], object]


@dataclass(frozen=True)
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

    def remaining(self) -> float:
        """Seconds left of the run's budget."""
        return self._remaining()

    def lease_lost(self) -> bool:
        """True once a heartbeat found this attempt's lease gone: another attempt may own the
        job now, and nothing this one returns will be recorded. Long jobs should stop."""
        return self.attempt_token in self._lost_tokens


class Registry:
    def __init__(self) -> None:
        self._functions: dict[str, JobFunction] = {}

    def job(self, kind: str) -> Callable[[JobFunction], JobFunction]:
        """Decorator: register `fn` as the function for `kind`."""
        if not kind or not kind.strip():
            raise ValueError("a job kind must not be empty")

        def register(fn: JobFunction) -> JobFunction:
            if kind in self._functions:
                raise ValueError(f"job kind {kind!r} is registered twice")
            self._functions[kind] = fn
            return fn

        return register

    def function_for(self, kind: str) -> JobFunction:
        try:
            return self._functions[kind]
        except KeyError:
            raise UnknownJobKind(f"no function is registered for job kind {kind!r}") from None

    def kinds(self) -> list[str]:
        return sorted(self._functions)

    def __contains__(self, kind: object) -> bool:
        return kind in self._functions


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
            raise ConfigError(
                f"PGDRAIN_JOBS: module {module_name!r} was not found on the Python path "
                "(which holds the current directory when run by the pgdrain command)"
            ) from None
        raise ConfigError(_import_failure(module_name, exc)) from None
    except Exception as exc:  # the user's module: anything its top level raises, in one line
        raise ConfigError(_import_failure(module_name, exc)) from None
    preferred = getattr(module, "jobs", None)
    if isinstance(preferred, Registry):
        return preferred
    for value in vars(module).values():
        if isinstance(value, Registry):
            return value
    raise ConfigError(f"PGDRAIN_JOBS: module {module_name!r} defines no pgdrain.Registry")


def _import_failure(module_name: str, exc: Exception) -> str:
    """One line: the module, the error, and where it was raised (the innermost frame, or the
    file and line of a syntax error)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}, line {exc.lineno}"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else ""
    return f"PGDRAIN_JOBS: module {module_name!r} failed to import: {text}" + (
        f" ({where})" if where else ""
    )
