"""bench/profile.py's driver's share: the medians per statement it reads off the runs, and the
table and ratios it writes from them (the measuring itself runs in `python -m bench.profile`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# bench/ is a top-level package beside handler/ (tests/unit/test_bench_cost.py says why).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import profile  # noqa: E402

JOBS = 20_000


def _run(wall_s: float, cpu_s: float, db_active_s: float) -> dict[str, Any]:
    """One run's figures, as run_once gives them: 2,000 statements."""
    return {"wall_s": wall_s, "cpu_s": cpu_s, "db_active_s": db_active_s, "statements": 2_000}


def test_per_statement_takes_medians_and_divides_by_the_statements() -> None:
    runs = [_run(2.0, 0.4, 1.6), _run(3.0, 0.5, 1.8), _run(2.2, 0.45, 1.7)]

    figures = profile.per_statement(runs, JOBS)

    assert figures["jobs_per_s"] == JOBS / 2.2
    assert round(figures["wall_us"]) == 1100  # 2.2 s over 2,000 statements
    assert round(figures["client_cpu_us"]) == 225
    assert round(figures["db_us"]) == 850
    assert round(figures["rest_us"]) == 25  # wall less CPU less the backend, medians each


def test_the_rest_is_negative_where_the_client_and_the_database_overlap() -> None:
    figures = profile.per_statement([_run(2.0, 0.6, 1.7)], JOBS)

    assert figures["rest_us"] < 0


def _share(pgbench_wall: float, alone_wall: float, drain_wall: float) -> dict[str, Any]:
    """A driver_share result at batch 10: the three clients' figures from one run each."""
    figures = {
        "pgbench": profile.per_statement([_run(pgbench_wall, 0.1, 1.7)], JOBS),
        "psycopg": profile.per_statement([_run(alone_wall, 0.4, 1.7)], JOBS),
        "pgdrain": profile.per_statement([_run(drain_wall, 0.8, 1.75)], JOBS),
    }
    return {"batch": 10, "concurrency": 10, "jobs": JOBS, "runs": {}, "figures": figures}


def test_the_table_puts_each_client_in_its_column_and_the_ratios_to_pgbench_last() -> None:
    lines = profile._drivers_markdown([_share(2.0, 2.5, 2.6)], reps=3)

    header = next(line for line in lines if line.startswith("| per statement,"))
    assert header == (
        "| per statement, batch 10, concurrency 10 (20,000 jobs) | pgbench | psycopg alone "
        "| pgdrain |"
    )
    assert "| jobs/s | 10,000 | 8,000 | 7,692 |" in lines
    assert "| wall, µs | 1000 | 1250 | 1300 |" in lines
    assert "| jobs/s, of pgbench's | 1.00 | 0.80 | 0.77 |" in lines
    summary = next(line for line in lines if line.startswith("At batch 10, concurrency 10,"))
    assert "psycopg alone gets **0.80x** pgbench's jobs/s" in summary
    assert "the drain **0.77x**: 0.96x of psycopg alone" in summary
    assert "psycopg alone spends 200 µs of CPU a statement where pgbench spends 50" in summary


def test_a_drain_faster_than_psycopg_alone_is_said_so() -> None:
    lines = profile._drivers_markdown([_share(2.0, 3.0, 2.8)], reps=3)

    summary = next(line for line in lines if line.startswith("At batch 10"))
    assert "the drain **0.71x**: 1.07x of psycopg alone" in summary


def test_each_setting_measured_gets_a_table_of_its_own_after_one_introduction() -> None:
    strict = {**_share(2.0, 3.0, 2.8), "batch": 1, "concurrency": 1}

    lines = profile._drivers_markdown([_share(2.0, 2.5, 2.6), strict], reps=3)

    headers = [line for line in lines if line.startswith("| per statement,")]
    assert [h.split(" (")[0] for h in headers] == [
        "| per statement, batch 10, concurrency 10",
        "| per statement, batch 1, concurrency 1",
    ]
    assert sum(line.startswith("The driver's share:") for line in lines) == 1
