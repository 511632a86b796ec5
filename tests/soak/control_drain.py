"""`pgdrain drain` with one safety mechanism switched off, for the soak's controls only:

    python -m soak.control_drain [--no-heartbeat] [--unfenced] -- drain --budget 3 --json

--no-heartbeat  Settings(heartbeat=False): leases are never extended.
--unfenced      completions are written without the attempt_token line of their statement
                (job_complete_and_claim, job_complete_many), so a late result of an attempt
                that lost its lease overwrites the job.

Everything else is the real CLI: the controls differ from the soak in exactly these switches."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any, LiteralString, cast

from helpers.fixtures import without_line
from pgdrain import cli, store
from pgdrain.settings import Settings
from pgdrain.sql import query

# The statements that record a completion, and the fence line each loses in the control.
COMPLETIONS = ("job_complete_and_claim", "job_complete_many")
FENCE = "AND j.attempt_token = held.token"


def _unfenced_query(name: str) -> LiteralString:
    statement = query(name)
    if name in COMPLETIONS:
        return cast(LiteralString, without_line(statement, FENCE))
    return statement


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="control_drain")
    parser.add_argument("--no-heartbeat", action="store_true")
    parser.add_argument("--unfenced", action="store_true")
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cli_args = [a for a in args.cli_args if a != "--"]

    if args.no_heartbeat:
        from_env = Settings.from_env.__func__  # type: ignore[attr-defined]

        def without_heartbeat(cls: type[Settings], env: Mapping[str, str]) -> Settings:
            settings: Settings = from_env(cls, env)
            return dataclasses.replace(settings, heartbeat=False)

        Settings.from_env = classmethod(without_heartbeat)  # type: ignore[method-assign,assignment]
    if args.unfenced:
        patched: Any = _unfenced_query
        store.query = patched  # what pgdrain.store runs: the same statements, less the fence
    return cli.main(cli_args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
