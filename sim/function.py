"""One execution environment: a process that imports the handler once (the cold start), then runs
one invocation at a time for the stand-in (`python -m sim.function`).

Protocol on stdin/stdout, one JSON object a line: the process prints {"ready": true} once
initialised; the stand-in sends {"event": ..., "deadline": EPOCH, "request_id": ...}; the process
answers {"ok": true, "result": ...} or {"ok": false, "error": ...} (the handler raised: a
function error). What the handler prints (logs, EMF metrics) goes to stderr, which the launcher
writes to a log file. A timeout is the stand-in's SIGKILL: nothing here runs after it."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, cast

from pgdrain.aws.context import FakeContext
from sim import jobs

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


def sim_context(message: dict[str, Any]) -> FakeContext:
    """A Lambda context whose remaining time counts down to the stand-in's deadline (real time,
    an epoch: the function's own settings are already scaled)."""
    return FakeContext(
        float(message["deadline"]) - time.time(),
        str(message["function_arn"]),  # ends in the function's name, as AWS_LAMBDA_FUNCTION_NAME
        clock=time.time,
        request_id=str(message["request_id"]),
        memory_mb=int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")),
        log_stream=f"sim/[$LATEST]{os.environ.get(jobs.ENV_ID_VARIABLE, '')}",
    )


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the handler's prints (logs, metrics) go to stderr, not into the protocol
    import app  # the cold start: settings, registry, Powertools

    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        message = json.loads(line)
        try:
            context = cast("LambdaContext", sim_context(message))  # the attributes it reads
            result = app.lambda_handler(message["event"], context)
            answer: dict[str, Any] = {"ok": True, "result": result}
        except Exception as exc:  # a function error, as Lambda reports it
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            jobs.close_ledger()
        protocol.write(json.dumps(answer, default=str) + "\n")


if __name__ == "__main__":
    main()
