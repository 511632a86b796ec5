"""A warm container for the soak: `pgdrain drain` run several times in one process, as Lambda
reuses an execution environment. Job threads a run gave up on go on into the next run.

    python -m soak.warm_drain N -- drain --budget 3 --json

Each run prints its result line; a run stopped by a signal ends the process with its code."""

from __future__ import annotations

import sys

from pgdrain.cli import commands


def main(argv: list[str]) -> int:
    runs = int(argv[0])
    args = [a for a in argv[1:] if a != "--"]
    code = 0
    for _ in range(runs):
        code = commands.main(args)
        if code >= 128:  # stopped by SIGINT/SIGTERM: the container is going away
            return code
        sys.stdout.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
