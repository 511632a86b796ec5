"""`pgdrain ARGS` in a process of its own, with AWS mocked in that process (moto: Lambda without
Docker, the drain function created in it), as a user runs the command where the function is
deployed. Every Invoke the command makes is written to the file named by PGDRAIN_TEST_INVOKES,
one JSON line each: {"function": ..., "type": ..., "event": ...}.

    python -m helpers.cli_under_moto [--control-no-kick] [--lambda-endpoint URL] -- ARGS...

--control-no-kick: the command as it was before it kicked (the control of
tests/acceptance/test_cli_kick.py). --lambda-endpoint: the command's Lambda API is there
instead (an address nothing answers at: the invoke fails)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

INVOKES_VARIABLE = "PGDRAIN_TEST_INVOKES"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control-no-kick", action="store_true")
    parser.add_argument("--lambda-endpoint")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args

    from helpers.aws import REGION, InvokeSpy, create_function, mocked_aws
    from pgdrain.aws.lambda_api import lambda_client
    from pgdrain.cli import commands

    if options.control_no_kick:
        commands._kick = lambda conn, settings, queues: []
    spy = InvokeSpy()
    try:
        with mocked_aws():
            create_function()
            if options.lambda_endpoint:  # for the command's clients, made from here on
                os.environ["AWS_ENDPOINT_URL_LAMBDA"] = options.lambda_endpoint
            for region in (None, REGION):  # by name (the default region) or by ARN
                spy.attach(lambda_client(region))
            return commands.main(args)
    finally:
        with Path(os.environ[INVOKES_VARIABLE]).open("w", encoding="utf-8") as out:
            for call in spy.calls:
                record = {
                    "function": call["FunctionName"],
                    "type": call["InvocationType"],
                    "event": json.loads(call["Payload"]),
                }
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main())
