"""Run the Lambda handler once in a process of its own and kill it at its deadline, as a Lambda
timeout does (os._exit: nothing in `finally` runs, nothing is flushed).

    python -m helpers.handler_process EVENT_JSON --budget 3

Settings come from the environment, as in Lambda (DATABASE_URL, PGDRAIN_*)."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import TYPE_CHECKING, cast

from helpers.aws import FakeContext

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("event")
    parser.add_argument("--budget", type=float, required=True)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    threading.Thread(target=_kill_at, args=(deadline,), daemon=True).start()

    import app  # the real entry point, cold-started from this process's environment

    context = cast("LambdaContext", FakeContext(args.budget))  # it has what the handler reads
    result = app.lambda_handler(json.loads(args.event), context)
    print(json.dumps(result), flush=True)


def _kill_at(deadline: float) -> None:
    while time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(137)


if __name__ == "__main__":
    main()
