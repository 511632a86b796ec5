"""bench/scale.py's arithmetic and its history generator's SQL, no server needed."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

# bench/ is a top-level package beside handler/ (as in test_bench_cost.py).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale import (  # noqa: E402
    Column,
    active_table,
    history_insert,
    history_table,
    paired_median,
    percentile,
    ratio,
    window_sizes,
    window_summary,
)


def test_window_sizes_split_the_run_and_keep_the_rest() -> None:
    assert window_sizes(1_000_000, 50_000) == [50_000] * 20
    assert window_sizes(120, 50) == [50, 50, 20]
    assert window_sizes(30, 50) == [30]
    with pytest.raises(ValueError):
        window_sizes(0, 50)
    with pytest.raises(ValueError):
        window_sizes(100, 0)


def test_window_summary_against_the_first_window() -> None:
    summary = window_summary([1000.0, 950.0, 920.0, 980.0])
    assert summary["last_over_first"] == pytest.approx(0.98)
    assert summary["min_over_first"] == pytest.approx(0.92)
    assert summary["flat"] is True
    # One window 11% below the first breaks the goal, even if the last recovers.
    dipped = window_summary([1000.0, 890.0, 1000.0])
    assert dipped["last_over_first"] == pytest.approx(1.0)
    assert dipped["flat"] is False
    assert window_summary([500.0])["min_over_first"] == 1.0
    assert window_summary([500.0])["tail_over_head"] == 1.0


def test_tail_over_head_compares_medians_of_three_windows() -> None:
    # One slow first window (another process took the CPU) does not make the run look faster.
    rates = [500.0, 1000.0, 1000.0, 990.0, 900.0, 900.0, 900.0]
    assert window_summary(rates)["last_over_first"] == pytest.approx(1.8)
    assert window_summary(rates)["tail_over_head"] == pytest.approx(0.9)
    assert window_summary([1000.0, 800.0])["tail_over_head"] == pytest.approx(0.8)
    with pytest.raises(ValueError):
        window_summary([])


def test_percentile_is_a_measured_value_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert math.isnan(percentile([], 50))


def test_paired_median_takes_each_round_against_its_pair() -> None:
    # Round 2 ran under load: both halves slow, its ratio unchanged.
    assert paired_median([2.0, 8.0, 2.2], [1.0, 4.0, 1.0]) == pytest.approx(2.0)
    assert math.isnan(paired_median([1.0], [0.0]))


def test_ratio_of_zero_is_not_a_number() -> None:
    assert ratio(2.0, 4.0) == 0.5
    assert math.isnan(ratio(1.0, 0.0))


def test_history_goes_to_the_finished_table_once_the_schema_has_one() -> None:
    assert history_table({"jobs", "kicks", "migrations"}) == "jobs"
    assert history_table({"active_jobs", "finished_jobs", "finished_jobs_p20261206"}) == (
        "finished_jobs"
    )
    with pytest.raises(RuntimeError):
        history_table({"kicks"})
    assert active_table({"jobs", "kicks"}) == "jobs"
    assert active_table({"active_jobs", "finished_jobs"}) == "active_jobs"


def test_history_insert_sets_the_columns_the_table_has() -> None:
    columns = [
        Column("id", True, True),  # identity: left to the table
        Column("queue", True, True),
        Column("kind", True, False),
        Column("payload", True, True),
        Column("status", True, True),
        Column("finished_at", False, False),
        Column("last_error", False, False),
    ]
    statement = history_insert("jobs", columns, None)
    assert statement.startswith('INSERT INTO pgdrain."jobs" (queue, kind, status, finished_at)')
    assert "generate_series(1, %(n)s)" in statement
    assert "nextval" not in statement


def test_history_insert_draws_an_id_without_default_from_the_jobs_sequence() -> None:
    columns = [Column("id", True, False), Column("kind", True, False)]
    statement = history_insert("finished_jobs", columns, "pgdrain.active_jobs_id_seq")
    assert 'pgdrain."finished_jobs" (id, kind)' in statement
    assert "nextval('pgdrain.active_jobs_id_seq'::regclass)" in statement
    with pytest.raises(RuntimeError, match="no default and no sequence"):
        history_insert("finished_jobs", columns, None)


def test_history_insert_refuses_a_required_column_it_cannot_fill() -> None:
    columns = [Column("kind", True, False), Column("archived_by", True, False)]
    with pytest.raises(RuntimeError, match="archived_by"):
        history_insert("finished_jobs", columns, None)


def _result(rates: list[float]) -> dict[str, Any]:
    windows = [
        {
            "window": n,
            "drained_total": 100 * n,
            "jobs_per_s": rate,
            "enqueue_per_s": 9000.0,
            "blocks_per_job": 30.0,
            "claim_blocks": 250.0,
            "dead_rows": 10,
            "autovacuums": n,
            "schema_mib": 1.0,
            "load": "1.50 / 1.00 / 0.50",
        }
        for n, rate in enumerate(rates, start=1)
    ]
    state = {"claims": 180, "p50_ms": 0.8, "p99_ms": 2.0, "mean_ms": 0.9, "blocks_per_claim": 250.0}
    return {
        "commit": "abc1234",
        "date": "2026-12-06 07:20 UTC",
        "server": "15.20",
        "load_before": "1 / 1 / 1",
        "load_after": "2 / 2 / 2",
        "seconds": 600.0,
        "jobs": 100 * len(rates),
        "window": 100,
        "note": "The schema as on main.",
        "throughput": {"windows": windows},
        "latency": {
            "claim_jobs": 2000,
            "rounds": 4,
            "history": {
                "table": "jobs",
                "rows": 50_000,
                "table_mib": 15.0,
                "insert_s": 1.0,
                "vacuum_analyze_s": 0.5,
            },
            "none": {**state, "drain_jobs_per_s": 5000.0},
            "with_history": {**state, "p50_ms": 1.6, "drain_jobs_per_s": 2500.0},
            "p50_ratio": 2.0,
            "p99_ratio": 1.0,
            "blocks_ratio": 1.25,
            "drain_ratio": 0.5,
        },
    }


def test_the_report_section_says_whether_each_goal_was_met() -> None:
    from bench import report

    text = "\n".join(
        report.scale_section({"now": _result([1000.0, 950.0]), "before": _result([1000.0, 500.0])})
    )
    # The baseline first, then the schema measured now.
    assert text.index("### Before the table split") < text.index("### Now")
    assert "slowest over the first: **0.95** (goal >= 0.9: met)" in text
    assert "slowest over the first: **0.50** (goal >= 0.9: **not met**)" in text
    assert "| with history / none | **2.00** | 1.00 | **1.25** | **0.50** |" in text
    assert "| 2 | 200 | 950 | 30.0 | 250.0 | 9,000 | 10 | 2 | 1 | 1.50 |" in text
    assert "The schema as on main." in text
    assert report.scale_section(None) == []
