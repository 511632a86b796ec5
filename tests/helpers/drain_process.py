"""Run one drain in a process of its own, as a Lambda invocation would, and print its result
as JSON. Used by tests that kill the process (SIGKILL) or need several concurrent drains.

    python -m helpers.drain_process URL --budget 5 --lease 2 [--no-heartbeat] [--no-cap]
        [--hard-kill-at-deadline]

--hard-kill-at-deadline ends the process with os._exit when the budget is spent, with
nothing in `finally` run: what a Lambda timeout does."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from helpers import ledger_jobs
from pgdrain import Budget, Settings
from pgdrain.controls import Controls
from pgdrain.runner.drain import drain_with


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--reserve", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--queues", default="default")
    parser.add_argument("--no-heartbeat", action="store_true")
    parser.add_argument("--no-cap", action="store_true")
    parser.add_argument("--hard-kill-at-deadline", action="store_true")
    args = parser.parse_args()

    os.environ[ledger_jobs.LEDGER_URL_VARIABLE] = args.url
    settings = Settings(
        lease_seconds=args.lease,
        reserve_seconds=args.reserve,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        queues=tuple(args.queues.split(",")),
    )
    switches = Controls(heartbeat=not args.no_heartbeat, cap_lease_at_deadline=not args.no_cap)
    budget = Budget.seconds(args.budget)
    if args.hard_kill_at_deadline:
        deadline = time.monotonic() + args.budget
        threading.Thread(target=_kill_at, args=(deadline,), daemon=True).start()
    result = drain_with(switches, settings, budget, ledger_jobs.jobs, args.url)
    print(json.dumps(result.as_dict()), flush=True)


def _kill_at(deadline: float) -> None:
    while time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(137)


if __name__ == "__main__":
    main()
