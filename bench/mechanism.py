"""One of the drain's optimisations on and off, one drain process, for jobs that take no time,
0.5 ms and 5 ms: prefetch (runner/prefetch.py, the default), `--mechanism pipelining`
(runner/pipelining.py, db/pipeline.py), or `--mechanism loop-thread` (at batch 1, concurrency
1, the job run on the loop's own thread or handed to a worker thread: runner/loop_thread.py),
or `--mechanism position` (claims from the run's keyset positions: runner/positions.py).
One command, from the repository root:

    make .venv-bench/.installed    # once
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv-bench/bin/python -m bench.mechanism [--mechanism pipelining|loop-thread|position]

Without DATABASE_URL an embedded PostgreSQL is started. Not part of `make bench` (it measures
one mechanism, not pgdrain against its ceiling or its peers). Each repetition drains the jobs
of one duration on a fresh database copied from a template, in this process, once with the
mechanism and once without (`drain_with(Controls(prefetch=False), ...)`, pgdrain.controls),
the two interleaved, each first in every other repetition; every job must end done with one
attempt. Prints jobs/s (medians of --reps) and their ratio."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import NamedTuple

from bench import run
from bench.common import Server, log, resolve_server
from pgdrain import Budget, Job, Registry, Settings
from pgdrain.controls import Controls
from pgdrain.runner.drain import drain_with

registry = Registry()


@registry.job("bench.sleep")
def sleep_for(job: Job) -> None:
    seconds = float(job.payload["seconds"])
    if seconds:
        time.sleep(seconds)


# (job seconds, jobs): a few seconds of draining each.
CASES: tuple[tuple[float, int], ...] = ((0.0, 20_000), (0.0005, 10_000), (0.005, 3_000))
# One job at a time: fewer jobs for as many seconds.
ONE_AT_A_TIME: tuple[tuple[float, int], ...] = ((0.0, 5_000), (0.0005, 4_000), (0.005, 1_000))


class Mechanism(NamedTuple):
    control: str  # the field of pgdrain.controls.Controls that switches it off
    settings: Settings
    cases: tuple[tuple[float, int], ...]


MECHANISMS = {
    "prefetch": Mechanism("prefetch", Settings(), CASES),
    "pipelining": Mechanism("pipelining", Settings(), CASES),
    "position": Mechanism("claim_from_position", Settings(), CASES),
    "loop-thread": Mechanism(
        "job_on_loop_thread", Settings(batch_size=1, concurrency=1), ONE_AT_A_TIME
    ),
}


def once(server: Server, name: str, jobs: int, mechanism: Mechanism, on: bool) -> float:
    copy = server.create(name)
    try:
        url = server.url(copy)
        began = time.perf_counter()
        controls = Controls()._replace(**{mechanism.control: on})
        result = drain_with(controls, mechanism.settings, Budget.seconds(600), registry, url)
        elapsed = time.perf_counter() - began
        ok, detail = run.verify_pgdrain(url, jobs)
    finally:
        server.drop(copy)
    if not ok or result.error is not None:
        raise SystemExit(f"the drain did not process every job once: {detail}")
    return jobs / elapsed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mechanism", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mechanism", choices=sorted(MECHANISMS), default="prefetch")
    args = parser.parse_args(argv)
    mechanism = MECHANISMS[args.mechanism]
    admin_url, source = resolve_server()
    server = Server(admin_url)
    log(f"server: {source}")
    print(f"| job | jobs | {args.mechanism} on, jobs/s | off, jobs/s | on / off |")
    print("|---:|---:|---:|---:|---:|")
    for seconds, jobs in mechanism.cases:
        name = run.pgdrain_template(server, jobs, "bench.sleep", {"seconds": seconds})
        try:
            on: list[float] = []
            off: list[float] = []
            for rep in range(args.reps):
                for first in (True, False) if rep % 2 == 0 else (False, True):
                    (on if first else off).append(once(server, name, jobs, mechanism, first))
        finally:
            server.drop(name)
        a, b = statistics.median(on), statistics.median(off)
        print(f"| {seconds * 1000:g} ms | {jobs:,} | {a:,.0f} | {b:,.0f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
