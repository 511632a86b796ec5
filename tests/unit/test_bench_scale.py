"""bench/scale.py's arithmetic and its history generator's SQL, no server needed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

# bench/ is a top-level package beside handler/ (as in test_bench_cost.py).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale import (  # noqa: E402
    Column,
    history_insert,
    history_table,
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
    with pytest.raises(ValueError):
        window_summary([])


def test_percentile_is_a_measured_value_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert math.isnan(percentile([], 50))


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
