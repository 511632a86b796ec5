"""Execution environments: processes running sim.function, reused one invocation at a time as
Lambda reuses a warm environment, and killed with SIGKILL at an invocation's deadline (Lambda's
timeout is a hard kill: nothing in the handler's `finally` runs).

Cold starts. Lambda initialises each new environment on a host of its own, so ten cold starts
at once take as long as one; on this machine's two cores seven imports at once took 3.4 to 4.4 s
where one takes about a second, and the runs a fan-out starts came seconds late for the
simulator's reason, not Lambda's. So the pool prepares its environments before the trace
starts, one at a time, and remembers how long each took to initialise alone; an environment's
first invocation waits that long (simulated: divided by the time scale) before it runs, as a
cold start would. The pool keeps that many alive (a killed one is replaced in the background);
beyond them an environment is started on demand and its real initialisation is its cold
start."""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sim.jobs import ENV_ID_VARIABLE

READY_TIMEOUT_SECONDS = 60.0  # real seconds an environment may take to initialise


@dataclass(frozen=True)
class Outcome:
    status: str  # ok | error (the handler raised) | timeout (killed at the deadline) | crash
    payload: Any = None
    ended_at: float = 0.0  # real epoch


class Environment:
    def __init__(self, env_id: str, env: Mapping[str, str], cwd: Path, log: IO[bytes]) -> None:
        self.env_id = env_id
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "sim.function"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**env, ENV_ID_VARIABLE: env_id},
            cwd=cwd,
        )
        self._buffer = b""
        self._ready = False
        self._spawned_at = time.time()
        self.init_s = 0.0  # real seconds from its start to ready
        self.cold = False  # prepared ahead: its first invocation waits out its cold start

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait_ready(self) -> bool:
        if self._ready:
            return True
        line = self._read_line(time.time() + READY_TIMEOUT_SECONDS)
        self._ready = line is not None and json.loads(line).get("ready") is True
        self.init_s = time.time() - self._spawned_at
        if not self._ready:
            self.kill()
        return self._ready

    def invoke(self, message: dict[str, Any], deadline: float) -> Outcome:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            return Outcome("crash", None, time.time())
        line = self._read_line(deadline)
        if line is None:
            killed = self.alive
            self.kill()
            return Outcome("timeout" if killed else "crash", None, time.time())
        answer = json.loads(line)
        status = "ok" if answer.get("ok") else "error"
        return Outcome(status, answer.get("result", answer.get("error")), time.time())

    def kill(self) -> None:
        if self.alive:
            self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.time()
            if left <= 0:
                return None
            try:
                readable, _, _ = select.select([fd], [], [], left)
                if not readable:
                    return None
                chunk = os.read(fd, 65536)
            except (OSError, ValueError):  # killed and closed meanwhile: the trace is over
                return None
            if not chunk:
                return None  # the process died
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


class Pool:
    """Lambda's execution environments: `prepared` of them initialised ahead (the module's
    docstring), reused while idle."""

    def __init__(
        self,
        env: Mapping[str, str],
        cwd: Path,
        log: IO[bytes],
        *,
        prefix: str,
        prepared: int,
        factor: float = 1.0,
    ) -> None:
        self._env, self._cwd, self._log = dict(env), cwd, log
        self._prefix, self._prepared, self._factor = prefix, prepared, factor
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._idle: list[Environment] = []
        self._all: list[Environment] = []
        self._closed = False
        self._topping_up = threading.Lock()  # one top-up at a time, or two would both add
        self.cold_starts = 0

    def start(self) -> None:
        self._top_up()

    def acquire(self) -> Environment | None:
        with self._lock:
            while self._idle and not self._idle[-1].alive:
                self._idle.pop()
            environment = self._idle.pop() if self._idle else None
        if environment is None:
            environment = self._new()  # on demand: its real initialisation is its cold start
        threading.Thread(target=self._top_up, daemon=True).start()
        if not environment.wait_ready():
            return None
        if environment.cold:
            environment.cold = False
            time.sleep(environment.init_s / self._factor)
        return environment

    def release(self, environment: Environment) -> None:
        with self._lock:
            if environment.alive and not self._closed:
                self._idle.append(environment)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            everything = list(self._all)
        for environment in everything:
            environment.kill()

    def _new(self) -> Environment:
        with self._lock:
            environment = Environment(
                f"{self._prefix}-{next(self._ids)}", self._env, self._cwd, self._log
            )
            self._all.append(environment)
            self.cold_starts += 1
        return environment

    def _top_up(self) -> None:
        """Prepares environments, one at a time, until `prepared` are alive."""
        if not self._topping_up.acquire(blocking=False):
            return  # another top-up is under way
        try:
            with self._lock:
                alive = sum(e.alive for e in self._all)
                missing = 0 if self._closed else self._prepared - alive
            for _ in range(max(0, missing)):
                environment = self._new()
                if environment.wait_ready():
                    environment.cold = True
                    self.release(environment)
        finally:
            self._topping_up.release()
