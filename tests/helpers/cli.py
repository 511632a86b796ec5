"""Running the real `pgdrain` command in a process of its own, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 120.0
EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def result(self) -> dict[str, Any]:
        """stdout as the one JSON object it must be."""
        lines = self.out.strip().splitlines()
        assert len(lines) == 1, f"stdout must be the result alone: {self.out!r}"
        payload = json.loads(lines[0])
        assert isinstance(payload, dict)
        return payload


def run_pgdrain(
    *args: str | bytes,
    env: Mapping[str, str],
    stdin: bytes = b"",
    drop: tuple[str, ...] = ("PGDRAIN_",),
    cwd: Path = ROOT,
    module: str = "pgdrain.cli",
) -> Run:
    """`pgdrain ARGS` (the package's entry point, in this interpreter; or `module`, a wrapper
    of it) from the repository (or `cwd`), with the environment less the variables starting
    with `drop`, plus `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    clean.update(env)
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=clean,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    return Run(
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def count_jobs(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
    assert row is not None
    return int(row[0])


def only_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, f"expected one line, got {lines!r}"
    return lines[0]
