"""The dashboard's pages on the big table (bench/bigtable.py: 2,000,000 finished jobs and
200,000 queued ones, VACUUM ANALYZE'd): each page requested through the resolver as `pgdrain
ui` serves it (a connection opened and closed per request, the store's read, the HTML), timed
from the event handed in to the answer returned; median, 99th percentile and maximum.

    python -m bench.ui_pages [--runs 200]

DATABASE_URL, else an embedded PostgreSQL. Prints one line per page; writes nothing."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from bench import bigtable
from bench.common import Server, log, resolve_server
from pgdrain.budget import Budget
from pgdrain.db import connection, store
from pgdrain.settings import Settings
from pgdrain.ui import app, csrf, local

# The jobs page with each filter an operator uses; the queues, job and control plane pages.
JOBS_PAGES = [
    "/jobs",
    "/jobs?status=failed",
    "/jobs?status=done",
    "/jobs?status=queued",
    "/jobs?status=running",
    "/jobs?queue=email",
    "/jobs?kind=noop",
    "/jobs?since=1h",
    "/jobs?before={middle}",
    "/jobs?status=parked",  # none at all: the index of finished rows says so
    "/jobs?queue=email&status=failed",  # none in that queue (all failures are in default)
]
OTHER_PAGES = ["/", "/jobs/{middle}", "/control"]


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def time_pages(url: str, pages: Sequence[str], runs: int, warmup: int = 5) -> list[dict[str, Any]]:
    settings = Settings()

    @contextlib.contextmanager
    def connect() -> Iterator[store.Connection]:
        with connection.connect(url, settings, Budget.seconds(10)) as conn:
            yield conn

    resolver = app.build(connect, app.UiConfig(actions=True, tokens=csrf.Tokens(b"b" * 32)))
    host = {"Host": "127.0.0.1:8080"}
    results = []
    for target in pages:
        ms: list[float] = []
        for i in range(warmup + runs):
            event = local.to_event("GET", target, host, b"", "127.0.0.1")
            began = time.perf_counter()
            answer = resolver.resolve(event, None)  # type: ignore[arg-type]
            elapsed = (time.perf_counter() - began) * 1000.0
            assert answer["statusCode"] == 200, (target, answer["body"][-300:])
            if i >= warmup:
                ms.append(elapsed)
        row = {
            "page": target,
            "median_ms": statistics.median(ms),
            "p99_ms": _percentile(ms, 0.99),
            "max_ms": max(ms),
        }
        log(
            f"  {target:<34} median {row['median_ms']:7.1f} ms   p99 {row['p99_ms']:7.1f} ms"
            f"   max {row['max_ms']:7.1f} ms"
        )
        results.append(row)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="requests per page")
    args = parser.parse_args(argv)
    admin_url, where = resolve_server()
    server = Server(admin_url)
    log(f"the dashboard on the big table, on {where}; {args.runs} requests per page")
    name = bigtable.template(server)
    try:
        url = server.url(name)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT (min(id) + max(id)) / 2 FROM pgdrain.jobs").fetchone()
        assert row is not None
        pages = [p.format(middle=row[0]) for p in JOBS_PAGES + OTHER_PAGES]
        time_pages(url, pages, args.runs)
    finally:
        server.drop(name)


if __name__ == "__main__":
    main()
