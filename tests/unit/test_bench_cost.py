"""bench/cost.py's arithmetic (pgdrain against SQS + Lambda), and the Cost section and the
strict-ordering row bench/report.py writes from a run's saved figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# bench/ is a top-level package beside handler/: pyproject's pythonpath names handler and
# tests only, and `pytest` run as a script does not put the root on the path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cost  # noqa: E402

if TYPE_CHECKING:
    from bench.run import Results

GB_S_HALF = 0.5 * cost.GB_SECOND  # one second at 512 MB
AT_512 = cost.Function(memory_mb=512, timeout_s=300.0)
ONE_VCPU = cost.Function(memory_mb=cost.ONE_VCPU_MB, timeout_s=300.0)
DRAIN = cost.Drain(wall_s_per_job=100e-6, cpu_s_per_job=40e-6, concurrency=10, run_overhead_s=0.0)


def test_sqs_counts_three_requests_and_one_invocation_per_ten_messages() -> None:
    result = cost.sqs_cost(1_000_000, 0.010, AT_512)
    assert result.invocations == 100_000
    assert result.sqs_requests == pytest.approx(300_000 * 0.40 / 1e6)
    assert result.lambda_requests == pytest.approx(100_000 * 0.20 / 1e6)
    # 10 messages of 10 ms one after the other, plus the 1 ms overhead: 101 ms each.
    assert result.billed_s == pytest.approx(100_000 * 0.101)
    assert result.duration == pytest.approx(100_000 * 0.101 * GB_S_HALF)
    assert result.total == pytest.approx(0.12 + 0.02 + 100_000 * 0.101 * GB_S_HALF)


def test_sqs_invocations_are_billed_to_the_next_millisecond() -> None:
    exact = cost.sqs_cost(10, 0.0015, AT_512)  # 15 ms + 1 ms: exactly 16, not 17
    assert exact.billed_s == pytest.approx(0.016)
    rounded = cost.sqs_cost(10, 0.00015, AT_512)  # 1.5 ms + 1 ms -> 3 ms
    assert rounded.billed_s == pytest.approx(0.003)


def test_sqs_last_partial_batch_is_one_more_invocation_of_its_own_length() -> None:
    result = cost.sqs_cost(25, 0.010, AT_512)
    assert result.invocations == 3
    assert result.sqs_requests == pytest.approx(9 * 0.40 / 1e6)
    assert result.billed_s == pytest.approx(2 * 0.101 + 0.051)


def test_pgdrain_no_op_jobs_cost_the_measured_time_stretched_by_the_vcpu_share() -> None:
    assert cost.pgdrain_seconds_per_job(DRAIN, ONE_VCPU, 0.0) == pytest.approx(100e-6)
    # 512 MB is 512/1769 of a vCPU: the 40 µs of CPU take 1769/512 times as long.
    expected = 60e-6 + 40e-6 * cost.ONE_VCPU_MB / 512
    assert cost.pgdrain_seconds_per_job(DRAIN, AT_512, 0.0) == pytest.approx(expected)
    big = cost.Function(memory_mb=4096, timeout_s=300.0)
    assert big.vcpu == 1.0  # one GIL: more vCPUs do not shorten the drain
    result = cost.pgdrain_cost(1_000_000, 0.0, DRAIN, AT_512)
    assert result.invocations == 1
    assert result.billed_s == pytest.approx(1_000_000 * expected)
    assert result.total == pytest.approx(1_000_000 * expected * GB_S_HALF + 0.20 / 1e6)


def test_pgdrain_long_jobs_overlap_by_the_concurrency_in_runs_of_the_timeout() -> None:
    drain = cost.Drain(100e-6, 40e-6, concurrency=10, run_overhead_s=0.014)
    result = cost.pgdrain_cost(1_000_000, 1.0, drain, AT_512)
    assert cost.pgdrain_seconds_per_job(drain, AT_512, 1.0) == pytest.approx(0.1)
    assert result.invocations == 334  # 100,000 s of work in runs of 300 s
    assert result.billed_s == pytest.approx(100_000 + 334 * 0.014)
    assert result.lambda_requests == pytest.approx(334 * 0.20 / 1e6)


def test_costs_grow_with_the_job_duration() -> None:
    durations = (0.001, 0.01, 0.1, 1.0)
    ours = [cost.pgdrain_cost(1_000_000, d, DRAIN, AT_512).total for d in durations]
    sqs = [cost.sqs_cost(1_000_000, d, AT_512).total for d in durations]
    assert ours == sorted(ours) and sqs == sorted(sqs)


def test_template_defaults_are_read_from_the_parameters(tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    template.write_text(
        "Parameters:\n"
        "  Timeout:\n    Type: Number\n    Default: 120\n    MinValue: 30\n"
        "  Other:\n    Type: String\n    Default: x\n"
        "  MemorySize:\n    Type: Number\n\n    Default: 1024\n"
        "Resources:\n  Fn:\n    Properties:\n      MemorySize: !Ref MemorySize\n"
    )
    assert cost.template_function(template) == cost.Function(memory_mb=1024, timeout_s=120.0)
    real = cost.template_function(ROOT / "template.yaml")
    assert real.memory_mb >= 128 and real.timeout_s >= 30


def test_template_without_the_parameter_is_an_error(tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    template.write_text("Parameters:\n  Timeout:\n    Type: Number\n    Default: 120\n")
    with pytest.raises(ValueError, match="MemorySize"):
        cost.template_function(template)


def _results() -> Results:
    """A saved run's figures, the few the cost section and the strict row read."""
    from bench.common import STRICT, STRICT_CEILING, Figure
    from bench.run import Config, Results

    res = Results(Config(reps=3, batches=(10,), peers=False))
    res.info["env"] = {"date": "d", "server": "s", "pgbench": "p", "machine": "m"}
    res.info["env"].update(python="3", psycopg="3", pgdrain="0", load_start="0", load_end="0")
    res.info["lambda"] = {"memory_mb": 512, "timeout_s": 300.0}
    res.info["best_batch"] = 10

    def fig(key: str, name: str, values: list[float], **params: object) -> Figure:
        figure = res.figure(key, name, **params)
        for value in values:
            figure.add(value)
        return figure

    pg = fig("pgdrain/10/1", "pgdrain", [9_000.0, 10_000.0, 11_000.0], batch=10, processes=1)
    pg.params["concurrency"] = 10
    for cpu in (0.9, 1.0, 1.1):
        pg.add_extra("cpu_s_per_1000_jobs", cpu / 20)
        pg.add_extra("rss_mb", 36.0)
    fig("ceiling/10/1", "ceiling", [20_000.0, 20_000.0, 20_000.0], batch=10, processes=1)
    fig(f"{STRICT}/1/1", "pgdrain", [900.0, 850.0, 800.0], batch=1, processes=1, concurrency=1)
    fig(f"{STRICT_CEILING}/1/1", "ceiling", [1_000.0] * 3, batch=1, processes=1)
    empty = fig("empty", "empty run", [2.0], via="handler")
    for key, value in (("total_ms", 14.0), ("run_ms", 8.0), ("statements", 2.0)):
        empty.add_extra(key, value)
    return res


def test_report_writes_the_strict_row_the_target_and_the_cost_table() -> None:
    from bench import report

    res = _results()
    text = report.markdown(res, "benchmarks.png")
    assert "| 1 | 1 | 850 | 1,000 | 0.85 |" in text
    assert "| batch 1, concurrency 1: pgdrain / ceiling | 0.85 | ≥ 0.8 | met |" in text
    assert "**0.050 CPU s per 1,000 no-op jobs**" in text
    assert "![cost per million jobs against job duration](benchmarks-cost.png)" in text
    assert "### Which memory size" in text
    assert "| 3,538 MB | 2.00 |" in text
    model = report.cost_model(res)
    assert model is not None
    drain, fn = model
    assert drain.wall_s_per_job == pytest.approx(1e-4)
    assert drain.run_overhead_s == pytest.approx(0.014)
    for d, label in ((0.001, "1 ms"), (0.01, "10 ms"), (0.1, "100 ms"), (1.0, "1 s")):
        sqs = cost.sqs_cost(1_000_000, d, fn)
        assert f"| {label} | " in text
        assert report._dollars(sqs.total) in text


def test_report_without_a_cpu_figure_has_no_cost_section() -> None:
    from bench import report

    res = _results()
    res.figures["pgdrain/10/1"].extra.pop("cpu_s_per_1000_jobs")
    text = report.markdown(res, "benchmarks.png")
    assert "## Cost" not in text
    assert "0.85" in text


def test_report_says_what_the_sql_leaves_for_best_against_best() -> None:
    from bench import report

    res = _results()
    assert "Best against best is bounded" not in report.markdown(res, "benchmarks.png")
    two = res.figure("pgdrain/10/2", "pgdrain", batch=10, processes=2, concurrency=10)
    ceiling = res.figure("ceiling/10/2", "ceiling", batch=10, processes=2)
    for value in (30_000.0, 30_000.0, 30_000.0):
        two.add(value)
        ceiling.add(value / 0.9)
    peer = res.figure("pgqueuer-asyncpg/250/2", "PgQueuer (asyncpg)", batch=250, processes=2)
    for value in (16_000.0, 16_500.0, 17_000.0):
        peer.add(value)
    text = report.markdown(res, "benchmarks.png")
    assert (
        "pgdrain's best, 30,000 jobs/s at batch 10 with 2 processes, is 0.90x its ceiling with "
        "as many pgbench clients (33,333 jobs/s); twice PgQueuer's best (33,000 jobs/s) is "
        "0.99x that ceiling" in text
    )


# -- which memory size -----------------------------------------------------------------------

MEASURED = cost.Drain(
    wall_s_per_job=133e-6, cpu_s_per_job=42e-6, concurrency=10, run_overhead_s=0.02
)


def test_no_op_and_io_bound_jobs_cost_least_in_the_smallest_function() -> None:
    for shape in (cost.JOB_SHAPES[0], cost.JOB_SHAPES[2]):
        rates = [cost.jobs_per_gb_second(MEASURED, m, shape) for m in cost.MEMORY_SIZES_MB]
        assert rates == sorted(rates, reverse=True), shape.name


def test_cpu_bound_jobs_cost_the_same_up_to_one_vcpu_then_need_a_process_per_vcpu() -> None:
    cpu = cost.JOB_SHAPES[1]
    small, one = (cost.jobs_per_gb_second(MEASURED, m, cpu) for m in (512, 1769))
    assert small == pytest.approx(one, rel=0.02)  # both pay for the vCPU share they use
    # Above 1,769 MB one process (one GIL) leaves the second vCPU idle; two use it.
    one_process = cost.jobs_per_gb_second(MEASURED, 3538, cpu, processes=1)
    two_processes = cost.jobs_per_gb_second(MEASURED, 3538, cpu, processes=2)
    assert one_process == pytest.approx(one / 2, rel=0.02)
    assert two_processes == pytest.approx(one, rel=0.02)
    assert cost.processes_for(3538) == 2 and cost.processes_for(512) == 1


def test_below_two_vcpus_a_second_process_pays_only_for_jobs_that_wait() -> None:
    # No-op and I/O-bound: the drain's time is mostly round trips, which a second process
    # overlaps with the first's. CPU-bound: one vCPU is all there is, shared by both.
    for shape, pays in zip(cost.JOB_SHAPES, (True, False, True), strict=True):
        one = cost.jobs_per_gb_second(MEASURED, 1769, shape, processes=1)
        two = cost.jobs_per_gb_second(MEASURED, 1769, shape, processes=2)
        assert (two > one * 1.05) is pays, shape.name
