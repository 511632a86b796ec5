"""The graphile-worker peer of `make bench` without Node: its result lines (recorded from
bench/graphile/drain.mjs), the check that every job ran exactly once, the URL node-postgres is
given, and the ratios and targets docs/benchmarks.md prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# bench/ is a top-level package beside handler/ (tests/unit/test_bench_cost.py says why).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import graphile, report  # noqa: E402
from bench.common import Figure  # noqa: E402
from bench.run import Config, Results  # noqa: E402

# Two drain processes' result lines, as drain.mjs printed them for 20,000 jobs.
RECORDED = [
    '{"bench_event":"result","start":1796541358.999,"end":1796541362.042,"executed":10012,'
    '"distinct":10012,"cpu_s":0.654709,"rss_mb":110.30078125}',
    '{"bench_event":"result","start":1796541359.001,"end":1796541362.040,"executed":9988,'
    '"distinct":9988,"cpu_s":0.631,"rss_mb":108.5}',
]


def _results() -> list[dict[str, Any]]:
    return [json.loads(line) for line in RECORDED]


def test_every_job_run_once_and_none_left_passes_the_check() -> None:
    check = graphile.check(20_000, 0, _results())

    assert check.ok
    assert "left in graphile_worker.jobs 0" in check.detail
    assert "20000 (20000 distinct job ids)" in check.detail


def test_a_job_left_in_the_table_fails_the_check() -> None:
    assert not graphile.check(20_000, 1, _results()).ok


def test_a_job_run_twice_fails_the_check_though_the_table_is_empty() -> None:
    results = _results()
    results[0]["executed"] += 1  # the same id twice: counted twice, distinct once

    assert not graphile.check(20_000, 0, results).ok
    assert graphile.check(20_001, 0, results).ok is False


def test_node_postgres_is_given_a_url_built_from_the_libpq_string() -> None:
    assert (
        graphile.node_url("host=127.0.0.1 port=5432 user=postgres dbname=gw_bench")
        == "postgresql://postgres@127.0.0.1:5432/gw_bench"
    )
    assert (
        graphile.node_url("host=db user=a password=p@ss/w dbname=x")
        == "postgresql://a:p%40ss%2Fw@db/x"
    )
    assert (
        graphile.node_url("host=/tmp/pg port=5433 user=u dbname=d")
        == "postgresql://u@localhost:5433/d?host=/tmp/pg"
    )


def _figure(name: str, values: list[float], **params: Any) -> Figure:
    fig = Figure(name, params)
    for value in values:
        fig.add(value)
    return fig


def _section_results() -> Results:
    res = Results(Config(reps=3, jobs=20_000))
    res.figures = {
        "graphile/graphile-worker/1": _figure(
            "graphile-worker", [6_000, 7_000, 6_500], processes=1
        ),
        "graphile/graphile-worker/2": _figure(
            "graphile-worker", [9_000, 9_500, 9_200], processes=2
        ),
        "graphile/pgdrain/10/1": _figure(
            "pgdrain", [12_000, 12_600, 13_000], batch=10, processes=1
        ),
        "graphile/pgdrain/250/1": _figure(
            "pgdrain", [9_000, 10_500, 9_750], batch=250, processes=1
        ),
    }
    env = {"pgdrain": "0.1.0 at abc1234", "date": "2026-12-06 07:50 UTC", "server": "PG"}
    res.info["graphile"] = {
        "env": {**env, "load_start": "1 / 1 / 1", "load_end": "2 / 2 / 2"},
        "version": "0.17.3",
        "node": "20.20.2",
        "tuning": graphile.DOCUMENTED.label(),
        "jobs": 20_000,
        "reps": 3,
        "batches": [10, 250],
        "processes": [1, 2],
    }
    return res


def test_ratios_are_paired_per_process_and_best_against_best() -> None:
    ratios = report.graphile_ratios(_section_results())

    # Each repetition's ratio, then the median: 2.0, 1.8, 2.0 at batch 10; 1.5, 1.5, 1.5 at 250.
    assert ratios["per_process"] == {10: 2.0, 250: 1.5}
    assert ratios["best"] == 12_600 / 9_200
    assert ratios["pgdrain_best_cell"] == {"batch": 10, "processes": 1}


def test_the_targets_say_which_ratio_misses() -> None:
    targets = report.graphile_targets(_section_results())

    assert [(what.split(":")[0], ok) for what, _, _, ok in targets] == [
        ("per process", True),
        ("per process", True),
        ("pgdrain best / graphile-worker best (jobs/s)", False),
    ]


def test_the_section_prints_both_sides_and_the_ratio_lines() -> None:
    text = "\n".join(report.graphile_section(_section_results()))

    assert "| graphile-worker 0.17.3 | documented tuning | 6,500 | 9,200 |" in text
    assert "| **pgdrain / graphile-worker** | batch 10 | 2.00 | - |" in text
    assert "**1.37x** graphile-worker's best, 9,200 jobs/s (2 processes)" in text


def test_a_run_without_node_says_why_graphile_is_missing() -> None:
    res = Results(Config())
    res.info["graphile"] = {"missing": "node is not installed"}

    assert report.graphile_section(res)[2] == "Not measured in this run: node is not installed."
    assert report.graphile_targets(res) == []
