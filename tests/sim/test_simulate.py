"""The simulator's smoke form, end to end, so that CI keeps `make simulate` from rotting: every
trace and system runs against real PostgreSQL, with the real handler in processes behind the
stand-in, and the report has one record per trace and system with exactly the issue's fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# Longer than the smoke form's own limit below (600 s), which says more when it is reached.
pytestmark = [pytest.mark.sim, pytest.mark.timeout(660)]

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {
    "trace",
    "system",
    "awake_minutes",
    "ideal_awake_minutes",
    "invocations",
    "peak_runs",
    "peak_connections",
    "p50_delay_s",
    "p99_delay_s",
    "max_delay_s",
    "makespan_s",
    "lost",
    "double_completions",
    "commit",
}
TRACES = {"sparse", "burst", "backlog", "backlog-trickle", "faults"}
SYSTEMS = {"pgdrain", "schedule-5min", "poller"}
LAMBDA_SYSTEMS = {"pgdrain", "schedule-5min"}


def test_the_smoke_form_measures_every_trace_and_system(tmp_path: Path) -> None:
    prefix = f"pgdrain_sim_test_{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "sim", "--smoke", "--no-plot", "--db-prefix", prefix]
    command += ["--out", str(tmp_path), "--logs", str(tmp_path / "logs")]
    done = subprocess.run(
        command, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    document = json.loads((tmp_path / "simulate.json").read_text())
    assert document["size"] == "smoke"
    records = document["records"]
    assert {(r["trace"], r["system"]) for r in records} == {(t, s) for t in TRACES for s in SYSTEMS}
    for record in records:
        assert set(record) == FIELDS
        assert record["commit"] == document["commit"]
        assert record["p50_delay_s"] is not None, record  # every system ran the trace's jobs
        assert record["double_completions"] == 0, record
        if record["system"] in LAMBDA_SYSTEMS:
            assert record["invocations"] > 0, record
    markdown = (tmp_path / "simulate.md").read_text()
    assert "SMOKE FORM" in markdown
    assert markdown.count("| burst |") == len(SYSTEMS)
