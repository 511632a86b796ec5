"""`pgdrain drain` with one safety mechanism switched off, for the soak's controls only:

    python -m soak.control_drain [--no-heartbeat] [--unfenced] -- drain --budget 3 --json

--no-heartbeat  Controls(heartbeat=False): leases are never extended.
--unfenced      completions are written without the attempt_token line of their statement
                (job_complete_and_claim, job_complete_many), so a late result of an attempt
                that lost its lease overwrites the job.

Everything else is the real CLI: the controls differ from the soak in exactly these switches."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import Any, LiteralString

from helpers.fixtures import unfenced
from pgdrain.cli import commands
from pgdrain.controls import Controls
from pgdrain.db.sql import query
from pgdrain.db.store import hot_path
from pgdrain.runner.drain import drain_with

# The statements that record a completion, and the fence line each loses in the control.
COMPLETIONS = ("job_complete_and_claim", "job_complete_many")


def _unfenced_query(name: str) -> LiteralString:
    if name in COMPLETIONS:
        return unfenced(name)
    return query(name)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="control_drain")
    parser.add_argument("--no-heartbeat", action="store_true")
    parser.add_argument("--unfenced", action="store_true")
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cli_args = [a for a in args.cli_args if a != "--"]

    if args.no_heartbeat:
        # The CLI's drain, with the heartbeat switched off: injected here, never a setting.
        # (Names the modules import, not export: replaced for this process, looked up at use.)
        cli_drain: Any = functools.partial(drain_with, Controls(heartbeat=False))
        commands.drain = cli_drain  # type: ignore[attr-defined]  # see above
    if args.unfenced:
        patched: Any = _unfenced_query
        # What the store runs: the same statements, less the fence.
        hot_path.query = patched  # type: ignore[attr-defined]  # as commands.drain above
    return commands.main(cli_args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
