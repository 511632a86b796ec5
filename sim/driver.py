"""The application (`python -m sim.driver`): enqueues a trace's jobs at their moments and kicks
the drain function after each commit, with pgdrain.enqueue and pgdrain.kick, exactly as an
application would. Whether kick() invokes anything is the system's choice: PGDRAIN_FUNCTION_NAME
set (pgdrain) or unset (the schedule alone, the polling worker)."""

from __future__ import annotations

import argparse
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from pgdrain.api.enqueue import build_job, enqueue, enqueue_many
from pgdrain.aws.kick import kick
from pgdrain.settings import Settings
from sim import traces
from sim.jobs import KIND
from sim.timescale import Scale

APPLICATION_NAME = "pgdrain-sim-driver"
BURST_THREADS = 8


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sim.driver")
    parser.add_argument("--trace", required=True, choices=traces.NAMES)
    parser.add_argument("--size", required=True, choices=("full", "smoke"))
    parser.add_argument("--backlog", type=int, default=None)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--scale", type=float, required=True)
    parser.add_argument("--origin", type=float, required=True)
    args = parser.parse_args()
    size = traces.FULL if args.size == "full" else traces.SMOKE
    if args.backlog is not None:
        size = traces.Size(**{**size.__dict__, "backlog_jobs": args.backlog})
    trace = traces.build(args.trace, size, args.seed)
    scale = Scale(args.scale, args.origin)
    settings = Settings.from_env(os.environ)
    url = os.environ["DATABASE_URL"]
    for batch in trace.batches:
        time.sleep(max(0.0, scale.at(batch.at_s) - time.time()))
        if batch.each:
            _burst(url, settings, scale, batch)
        else:
            _one_transaction(url, settings, scale, batch)


def _payload(batch: traces.Batch) -> dict[str, Any]:
    return {"ms": batch.ms, "fail_once": batch.fail_once, "hang_first": batch.hang_first}


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, application_name=APPLICATION_NAME)


def _one_transaction(url: str, settings: Settings, scale: Scale, batch: traces.Batch) -> None:
    with _connect(url) as conn:
        with conn.transaction():
            if batch.count == 1:
                enqueue(
                    conn,
                    KIND,
                    _payload(batch),
                    queue=batch.queue,
                    delay=scale.real(batch.delay_s),
                )
            else:
                job = build_job(
                    KIND, _payload(batch), queue_name=batch.queue, delay=scale.real(batch.delay_s)
                )
                enqueue_many(conn, [job] * batch.count)
        kick(conn, [batch.queue], settings=settings)


def _burst(url: str, settings: Settings, scale: Scale, batch: traces.Batch) -> None:
    """count enqueue+kick pairs, each its own transaction, from several threads at once."""
    local = threading.local()
    opened: list[psycopg.Connection[Any]] = []
    lock = threading.Lock()

    def one(_: int) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = _connect(url)
            with lock:
                opened.append(conn)
        with conn.transaction():
            enqueue(conn, KIND, _payload(batch), queue=batch.queue, delay=scale.real(batch.delay_s))
        kick(conn, [batch.queue], settings=settings)

    try:
        with ThreadPoolExecutor(BURST_THREADS) as pool:
            list(pool.map(one, range(batch.count)))
    finally:
        for conn in opened:
            conn.close()


if __name__ == "__main__":
    main()
