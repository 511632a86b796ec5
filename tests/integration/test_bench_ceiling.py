"""The SQL ceiling `make bench` compares the drain with (bench/ceiling.py) runs pgdrain's own
claim statement through pgbench. The statement changes with the product (the rate limits and
pause rows joined its result with UNION ALL, which broke the ceiling's rewrite unnoticed until
the next `make bench`): the ceiling must drain a real queue with today's statement."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgdrain import enqueue_many
from pgdrain.api.enqueue import build_job

# bench/ is a top-level package beside handler/ (tests/unit/test_bench_cost.py says why).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import ceiling  # noqa: E402

JOBS = 205  # not a multiple of the batch: the last claim takes fewer


@pytest.mark.parametrize(("batch", "clients"), [(10, 1), (50, 2)])
def test_the_ceiling_completes_every_job_once_with_todays_claim(
    db_url: str, conn: psycopg.Connection[Any], batch: int, clients: int
) -> None:
    enqueue_many(conn, [build_job("noop", {"n": n}) for n in range(JOBS)])
    result = ceiling.run(db_url, JOBS, batch, clients)
    assert result.failed == 0, result.output
    per_client = ceiling.transactions_per_client(JOBS, batch, clients)
    assert result.transactions == per_client * clients, result.output
    rows = conn.execute(
        "SELECT status, attempts, count(*) FROM pgdrain.jobs GROUP BY 1, 2"
    ).fetchall()
    assert rows == [("done", 1, JOBS)]
